// tests/nccl/request_test.cpp: the JSON fields of /init_weights_update_group,
// /update_weights_from_distributed and /destroy_weights_update_group as SGLang sends them:
// accepted with SGLang's defaults, and every malformed field refused with INVALID_ARGUMENT naming
// it (names, dtypes, shapes, ranks, ports, backend, bucket size, timeouts).
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "control/requests.hpp"

namespace ferry::control {
namespace {

using nlohmann::json;

json sglang_init() {
  return json{{"master_address", "10.0.0.1"}, {"master_port", 29500}, {"rank_offset", 1},
              {"world_size", 3},              {"group_name", "g"},  {"backend", "nccl"}};
}

json sglang_update() {
  return json{{"names", {"model.embed_tokens.weight", "lm_head.weight"}},
              {"dtypes", {"bfloat16", "torch.bfloat16"}},
              {"shapes", {{151936, 1024}, {151936, 1024}}},
              {"group_name", "g"},
              {"flush_cache", true},
              {"weight_version", "step-3"}};
}

template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

std::string init_refusal(json body) {
  return refusal([&] { parse_group_init(body); });
}
std::string update_refusal(json body) {
  return refusal([&] { parse_distributed_update(body); });
}

TEST(NcclRequest, InitTakesSglangFields) {
  const auto init = parse_group_init(sglang_init());
  EXPECT_EQ(init.master_address, "10.0.0.1");
  EXPECT_EQ(init.master_port, 29500);
  EXPECT_EQ(init.rank_offset, 1u);
  EXPECT_EQ(init.rank, 1u);
  EXPECT_EQ(init.world_size, 3u);
  EXPECT_EQ(init.group_name, "g");
  EXPECT_EQ(init.backend, "nccl");
  EXPECT_EQ(init.init_timeout, std::chrono::milliseconds(120000));

  json minimal = sglang_init();
  minimal.erase("group_name");
  minimal.erase("backend");
  minimal["timeout_s"] = 2.5;
  const auto defaults = parse_group_init(minimal);
  EXPECT_EQ(defaults.group_name, "weight_update_group");
  EXPECT_EQ(defaults.backend, "nccl");
  EXPECT_EQ(defaults.init_timeout, std::chrono::milliseconds(2500));
}

TEST(NcclRequest, InitRefusesBadFields) {
  auto with = [](const char* key, json value) {
    json b = sglang_init();
    b[key] = std::move(value);
    return b;
  };
  auto without = [](const char* key) {
    json b = sglang_init();
    b.erase(key);
    return b;
  };
  EXPECT_NE(init_refusal(without("master_address")).find("'master_address' is required"),
            std::string::npos);
  EXPECT_NE(init_refusal(with("master_address", 5)).find("'master_address' must be"),
            std::string::npos);
  EXPECT_NE(init_refusal(with("master_port", 70000)).find("'master_port'"), std::string::npos);
  EXPECT_NE(init_refusal(with("master_port", 0)).find("'master_port'"), std::string::npos);
  EXPECT_NE(init_refusal(with("master_port", "29500")).find("'master_port'"), std::string::npos);
  EXPECT_NE(init_refusal(with("rank_offset", 0)).find("rank 0 of a weight-update group is the trainer"),
            std::string::npos);
  EXPECT_NE(init_refusal(with("rank_offset", -1)).find("'rank_offset'"), std::string::npos);
  EXPECT_NE(init_refusal(with("rank_offset", 3)).find("outside world_size 3"), std::string::npos);
  EXPECT_NE(init_refusal(with("world_size", 0)).find("'world_size' must be >= 1"),
            std::string::npos);
  EXPECT_NE(init_refusal(with("backend", "mpi")).find("backend 'mpi' is not supported"),
            std::string::npos);
  EXPECT_NE(init_refusal(with("group_name", "")).find("'group_name'"), std::string::npos);
  EXPECT_NE(init_refusal(with("timeout_s", -1)).find("'timeout_s'"), std::string::npos);
}

TEST(NcclRequest, UpdateTakesSglangFields) {
  const auto u = parse_distributed_update(sglang_update());
  ASSERT_EQ(u.tensors.size(), 2u);
  EXPECT_EQ(u.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(u.tensors[0].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(u.tensors[1].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(u.tensors[1].bytes, 151936ull * 1024 * 2);
  EXPECT_EQ(u.group_name, "g");
  EXPECT_EQ(u.weight_version, std::optional<std::string>("step-3"));
  EXPECT_EQ(u.bucket_bytes, nccl::kDefaultBucketBytes);

  json b = sglang_update();
  b.erase("group_name");
  b.erase("weight_version");
  b["bucket_bytes"] = 64 << 20;
  b["timeout_s"] = 30;
  const auto d = parse_distributed_update(b);
  EXPECT_EQ(d.group_name, "weight_update_group");
  EXPECT_FALSE(d.weight_version.has_value());
  EXPECT_EQ(d.bucket_bytes, 64u << 20);
  EXPECT_EQ(d.bucket_timeout, std::chrono::milliseconds(30000));
}

TEST(NcclRequest, UpdateRefusesBadNamesDtypesAndShapes) {
  auto with = [](const char* key, json value) {
    json b = sglang_update();
    b[key] = std::move(value);
    return b;
  };
  EXPECT_NE(update_refusal(with("names", "w")).find("'names' must be a list"), std::string::npos);
  EXPECT_NE(update_refusal(with("names", {"a", 7})).find("names[1] must be a string"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("names", {"a", "a"})).find("'a' (names[1]) is listed twice"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("names", {"a", ""})).find("names[1] is empty"), std::string::npos);
  EXPECT_NE(update_refusal(with("names", {"a"})).find("same length (got 1, 2, 2)"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("dtypes", {"bfloat16", "complex64"})).find("unknown dtype 'complex64'"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("dtypes", {"bfloat16", 3})).find("dtypes[1] must be a string"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("shapes", {{2, 2}, {-1, 4}})).find("shapes[1][0]"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("shapes", {{2, 2}, 4})).find("shapes[1] must be a list"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("shapes", {{2, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 1}})).find("9 dims"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("shapes", {{2, 2}, {1ull << 62, 8}})).find("overflows"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("bucket_bytes", 1000)).find("bucket_bytes 1000 is outside"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("flush_cache", "yes")).find("'flush_cache' must be a boolean"),
            std::string::npos);
  EXPECT_NE(update_refusal(with("weight_version", 1.5)).find("'weight_version'"),
            std::string::npos);
  json missing = sglang_update();
  missing.erase("shapes");
  EXPECT_NE(update_refusal(missing).find("'shapes' is required"), std::string::npos);
}

TEST(NcclRequest, DestroyTakesTheGroupNameOrSglangsDefault) {
  EXPECT_EQ(parse_group_name(json{{"group_name", "g"}}), "g");
  EXPECT_EQ(parse_group_name(json::object()), "weight_update_group");
  EXPECT_NE(refusal([] { parse_group_name(json{{"group_name", 3}}); }).find("'group_name'"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::control
