// tests/control/vllm_routes_test.cpp: vLLM's RL routes against a real `ferry serve` (CPU, no
// generation), each called as vLLM's own clients call it (HTTPVLLMWeightSyncClient's bodies, the
// query parameters of /pause, /sleep and /wake_up) with the answer's shape checked: pause and
// resume, the start / update / finish protocol's order and its weight version, the weight checker
// (checksum, reset, compare) and finish's checksum baseline, sleep levels and partial wake-ups,
// the NCCL update info refused without a group, and malformed bodies and queries refused naming
// the field. The body parsers are checked directly with vLLM's dataclasses as asdict() gives them.
#include <gtest/gtest.h>

#include <ferry/sdk/error.hpp>

#include <memory>
#include <string>

#include "control/requests.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

// asdict(NCCLWeightTransferUpdateInfo(names=..., dtype_names=..., shapes=..., packed=True)), as
// vLLM's trainer puts it into update_info.
json vllm_update_info() {
  return json{{"names", {"model.embed_tokens.weight", "lm_head.weight"}},
              {"dtype_names", {"bfloat16", "bfloat16"}},
              {"shapes", {{151936, 1024}, {151936, 1024}}},
              {"packed", true},
              {"packed_buffer_size_bytes", 1073741824},
              {"packed_num_buffers", 2}};
}

std::string message_of(const Reply& r) {
  return r.body.is_object() ? r.body.value("message", "") : "";
}

// The INVALID_ARGUMENT message of a parser's refusal ("" and a failure when it accepted).
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

TEST(VllmRequests, UpdateInfoAsVllmsTrainerSendsIt) {
  const auto u = control::parse_weights_update(json{{"update_info", vllm_update_info()}}, 0, 1);
  ASSERT_EQ(u.tensors.size(), 2u);
  EXPECT_EQ(u.tensors[1].name, "lm_head.weight");
  EXPECT_EQ(u.tensors[0].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(u.tensors[0].shape, (std::vector<std::uint64_t>{151936, 1024}));
  EXPECT_EQ(u.bucket_bytes, 1073741824u);
  EXPECT_EQ(u.group_name, "weight_update_group");
  EXPECT_FALSE(u.effects.flush_cache);
  EXPECT_FALSE(u.weight_version.has_value());
  // Without packed_buffer_size_bytes: the bucket size ferry's rank 0 uses by default.
  json bare = vllm_update_info();
  bare.erase("packed_buffer_size_bytes");
  bare.erase("packed_num_buffers");
  bare.erase("packed");
  EXPECT_EQ(control::parse_weights_update(json{{"update_info", bare}}, 0, 1).bucket_bytes,
            nccl::kDefaultBucketBytes);
  // One update_info per worker: this receiver reads entry tp_rank.
  json second = vllm_update_info();
  second["names"] = {"a", "b"};
  const auto per_worker = control::parse_weights_update(
      json{{"update_info", json::array({vllm_update_info(), second})}}, 1, 2);
  EXPECT_EQ(per_worker.tensors[0].name, "a");
}

TEST(VllmRequests, MalformedUpdateInfoIsRefusedNamingTheField) {
  auto refused = [](const json& info, std::uint32_t tp_rank = 0, std::uint32_t tp_size = 1) {
    return refusal([&] {
      control::parse_weights_update(json{{"update_info", info}}, tp_rank, tp_size);
    });
  };
  EXPECT_NE(refusal([] {
              control::parse_weights_update(json::object(), 0, 1);
            }).find("field 'update_info' is required"),
            std::string::npos);
  json no_dtypes = vllm_update_info();
  no_dtypes.erase("dtype_names");
  EXPECT_NE(refused(no_dtypes).find("update_info: field 'dtype_names' is required"),
            std::string::npos);
  json short_shapes = vllm_update_info();
  short_shapes["shapes"] = {{4}};
  EXPECT_NE(refused(short_shapes).find("shapes"), std::string::npos);
  json packed = vllm_update_info();
  packed["packed"] = "yes";
  EXPECT_NE(refused(packed).find("'packed' must be a boolean"), std::string::npos);
  json tiny = vllm_update_info();
  tiny["packed_buffer_size_bytes"] = 10;
  EXPECT_NE(refused(tiny).find("update_info: "), std::string::npos);
  json none = vllm_update_info();
  none["packed_num_buffers"] = 0;
  EXPECT_NE(refused(none).find("'packed_num_buffers' must be at least 1"), std::string::npos);
  EXPECT_NE(refused(json::array({vllm_update_info()}), 0, 2).find("one per worker, 2"),
            std::string::npos);
  EXPECT_NE(refused(json::array({vllm_update_info(), 3}), 1, 2).find("update_info[1]"),
            std::string::npos);
  EXPECT_NE(refused(json("names")).find("must be an object"), std::string::npos);
}

TEST(VllmRequests, InitInfoAsVllmsTrainerSendsIt) {
  const auto init = control::parse_weight_transfer_init(json{{"init_info",
                                                              {{"master_address", "10.0.0.1"},
                                                               {"master_port", 29500},
                                                               {"rank_offset", 1},
                                                               {"world_size", 3}}}});
  EXPECT_EQ(init.master_address, "10.0.0.1");
  EXPECT_EQ(init.master_port, 29500);
  EXPECT_EQ(init.rank_offset, 1u);
  EXPECT_EQ(init.world_size, 3u);
  EXPECT_EQ(init.group_name, "weight_update_group");
  EXPECT_EQ(init.backend, "nccl");
  EXPECT_NE(refusal([] {
              control::parse_weight_transfer_init(json{{"init_info", json::object()}});
            }).find("init_weight_transfer_engine: init_info: field 'master_address' is required"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              control::parse_weight_transfer_init(json{{"init_info", 5}});
            }).find("'init_info' must be an object"),
            std::string::npos);
}

TEST(VllmRequests, QueryParametersAreDecodedAndChecked) {
  const auto q = control::parse_query("tags=weights&tags=kv_cache&&x=%2Fa+b&flag");
  ASSERT_EQ(q.size(), 4u);
  EXPECT_EQ(q[1], (std::pair<std::string, std::string>{"tags", "kv_cache"}));
  EXPECT_EQ(q[2].second, "/a b");
  EXPECT_EQ(q[3], (std::pair<std::string, std::string>{"flag", ""}));
  EXPECT_EQ(control::parse_wake_up_tags(q), (std::vector<std::string>{"weights", "kv_cache"}));
  EXPECT_NE(refusal([] { control::parse_query("mode=%zz"); }).find("two hex digits"),
            std::string::npos);
  EXPECT_NE(refusal([] { control::parse_query("mode=a%00b"); }).find("NUL"), std::string::npos);
  EXPECT_EQ(control::parse_vllm_pause(control::parse_query("")).mode, "abort");
  EXPECT_TRUE(control::parse_vllm_pause(control::parse_query("")).clear_cache);
  EXPECT_EQ(control::parse_vllm_pause(control::parse_query("wait_for_inflight_requests=True")).mode,
            "wait");
  EXPECT_FALSE(control::parse_vllm_pause(control::parse_query("clear_cache=false")).clear_cache);
  EXPECT_NE(refusal([] {
              control::parse_vllm_pause(control::parse_query("clear_cache=maybe"));
            }).find("'clear_cache' must be a boolean"),
            std::string::npos);
  EXPECT_EQ(control::parse_sleep(control::parse_query("level=2&mode=keep")).level, 2);
  EXPECT_EQ(control::parse_sleep(control::parse_query("level=2&mode=keep")).pause.mode, "keep");
  EXPECT_NE(refusal([] { control::parse_sleep(control::parse_query("level=0")); }).find("'level'"),
            std::string::npos);
  EXPECT_NE(
      refusal([] { control::parse_wake_up_tags(control::parse_query("tags=")); }).find("'tags'"),
      std::string::npos);
}

class VllmRoutes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(make_dense_checkpoint(
        DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 11));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 1);
    ServeOptions o;
    o.model_path = model_path();
    serve_ = std::make_unique<ServeProcess>(o);
  }
  static void TearDownTestSuite() {
    serve_.reset();
    checkpoint_.reset();
    dir_.reset();
  }
  static std::string model_path() { return (dir_->path() / "model").string(); }
  // requests.post(url, json=None): no body at all.
  static Reply post(const std::string& path) { return serve_->post_raw(path, ""); }
  static Reply post(const std::string& path, const json& body) { return serve_->post(path, body); }
  static Reply get(const std::string& path) { return serve_->get(path); }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TempDir> VllmRoutes::dir_;
std::unique_ptr<Checkpoint> VllmRoutes::checkpoint_;
std::unique_ptr<ServeProcess> VllmRoutes::serve_;

TEST_F(VllmRoutes, PauseResumeAndIsPausedAnswerVllmsShapes) {
  Reply r = post("/pause");  // mode abort, clear_cache true: vLLM's defaults
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"status", "paused"}}));
  EXPECT_EQ(get("/is_paused").body, json({{"is_paused", true}}));
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["pause_mode"], "abort");
  r = post("/resume");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"status", "resumed"}}));
  EXPECT_EQ(get("/is_paused").body, json({{"is_paused", false}}));
  // keep: the requests stay frozen where they are (SGLang's in_place).
  ASSERT_EQ(post("/pause?mode=keep").status, 200);
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["pause_mode"], "in_place");
  // wait: ferry serve runs no requests, so there are none to wait for.
  ASSERT_EQ(post("/pause?mode=wait&clear_cache=false").status, 200);
  EXPECT_EQ(get("/is_paused").body["is_paused"], true);
  ASSERT_EQ(post("/resume").status, 200);
  Reply bad = post("/pause?mode=sleep");
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_NE(message_of(bad).find("'mode' is 'sleep'"), std::string::npos) << bad.text;
  bad = post("/pause?clear_cache=perhaps");
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_NE(message_of(bad).find("'clear_cache'"), std::string::npos) << bad.text;
  EXPECT_EQ(get("/is_paused").body["is_paused"], false);
}

TEST_F(VllmRoutes, WeightUpdateProtocolKeepsVllmsOrderAndVersion) {
  // Out of order: vLLM's state machine answers 409.
  Reply r = post("/update_weights", json{{"update_info", vllm_update_info()}});
  EXPECT_EQ(r.status, 409) << r.text;
  EXPECT_NE(message_of(r).find("without a preceding start_weight_update"), std::string::npos);
  r = post("/finish_weight_update");
  EXPECT_EQ(r.status, 409) << r.text;
  r = post("/start_weight_update", json{{"include_draft", true}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("no draft model"), std::string::npos) << r.text;

  r = post("/start_weight_update");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"message", "Weight update started"}}));
  EXPECT_EQ(post("/start_weight_update").status, 409);
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["weight_update_session"], true);
  // The NCCL update info is read, then refused: no weight transfer engine was initialised.
  r = post("/update_weights", json{{"update_info", vllm_update_info()}});
  EXPECT_TRUE(r.status == 404 || r.status == 501) << r.text;  // 501: a build without NCCL
  if (r.status == 404) {
    EXPECT_NE(message_of(r).find("/init_weight_transfer_engine first"), std::string::npos)
        << r.text;
  }
  r = post("/update_weights", json::object());
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("'update_info' is required"), std::string::npos) << r.text;
  // Any update may run inside the session (each its own transaction, published on commit).
  ASSERT_EQ(post("/update_weights_from_disk", json{{"model_path", model_path()}}).status, 200);
  EXPECT_NE(get("/weight_info").body.value("weight_version", ""), "step-7");
  r = post("/finish_weight_update", json{{"weight_version", "step-7"}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"message", "Weight update finished"}}));
  EXPECT_EQ(get("/weight_info").body, json({{"weight_version", "step-7"}}));
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["weight_update_session"], false);
  // HTTPVLLMWeightSyncClient.finish_weight_update() without a version sends no body: the version
  // stays.
  ASSERT_EQ(post("/start_weight_update").status, 200);
  ASSERT_EQ(post("/finish_weight_update").status, 200);
  EXPECT_EQ(get("/weight_info").body["weight_version"], "step-7");
  r = post("/update_weight_version", json{{"new_version", "step-8"}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["success"], true);
  EXPECT_EQ(r.body["new_version"], "step-8");
  EXPECT_EQ(get("/weight_info").body["weight_version"], "step-8");
  r = post("/finish_weight_update", json{{"weight_version", json::array()}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("'weight_version'"), std::string::npos) << r.text;
}

TEST_F(VllmRoutes, InitWeightTransferEngineNeedsItsInitInfo) {
  Reply r = post("/init_weight_transfer_engine", json::object());
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("'init_info' is required"), std::string::npos) << r.text;
  r = post("/init_weight_transfer_engine", json{{"init_info", json::object()}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("init_info: field 'master_address' is required"), std::string::npos)
      << r.text;
  // vLLM's NCCL init info (with ferry's timeout_s): nobody serves rank 0's rendezvous on port 1.
  // tests/nccl/routes_test.cpp checks the status of each machine (no NCCL, no GPU, no rank 0).
  r = post("/init_weight_transfer_engine", json{{"init_info",
                                                 {{"master_address", "127.0.0.1"},
                                                  {"master_port", 1},
                                                  {"rank_offset", 1},
                                                  {"world_size", 2},
                                                  {"timeout_s", 1}}}});
  EXPECT_TRUE(r.status == 409 || r.status == 501 || r.status == 504) << r.text;
  EXPECT_EQ(r.body.value("success", true), false) << r.text;
}

TEST_F(VllmRoutes, WeightCheckerAndFinishBaselineCatchAMissedUpdate) {
  EXPECT_EQ(post("/weight_checker", json::object()).status, 400);
  Reply r = post("/weight_checker", json{{"action", "compare"}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("'baseline'"), std::string::npos) << r.text;
  const Reply sum = post("/weight_checker", json{{"action", "checksum"}});
  ASSERT_EQ(sum.status, 200) << sum.text;
  ASSERT_EQ(sum.body.size(), 1u) << sum.text;
  const json baseline = sum.body["checksums"];
  const auto prints = serve_->fingerprints();
  ASSERT_EQ(baseline.size(), prints.size());
  for (const auto& [name, hex] : prints) {
    EXPECT_EQ(baseline.value("dp0:pp0:pcp0:tp0:ep0:" + name, ""), hex) << name;
  }
  r = post("/weight_checker", json{{"action", "compare"}, {"baseline", baseline}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(
      r.body,
      json({{"match", true}, {"mismatches", json::array()}, {"ranks", {"dp0:pp0:pcp0:tp0:ep0:"}}}));

  r = post("/weight_checker", json{{"action", "reset"}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"status", "reset"}}));
  r = post("/weight_checker", json{{"action", "compare"}, {"baseline", baseline}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["match"], false);
  EXPECT_EQ(r.body["mismatches"].size(), baseline.size());
  // A second report (another replica's checksum answer) is held to the same keys.
  json other = baseline;
  other.erase(other.begin());
  r = post("/weight_checker",
           json{{"action", "compare"}, {"baseline", baseline}, {"checksums", {other}}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["match"], false);

  // finish_weight_update with the baseline: an update that restores every tensor passes...
  ASSERT_EQ(post("/start_weight_update").status, 200);
  ASSERT_EQ(post("/update_weights_from_disk", json{{"model_path", model_path()}}).status, 200);
  r = post("/finish_weight_update", json{{"weight_version", "restored"}, {"baseline", baseline}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(get("/weight_info").body["weight_version"], "restored");
  // ...one that leaves the reset weights is 409 naming the tensors, and the version stays.
  ASSERT_EQ(post("/weight_checker", json{{"action", "reset"}}).status, 200);
  const std::string after_reset = get("/weight_info").body["weight_version"];
  ASSERT_EQ(post("/start_weight_update").status, 200);
  r = post("/finish_weight_update", json{{"weight_version", "wrong"}, {"baseline", baseline}});
  EXPECT_EQ(r.status, 409) << r.text;
  EXPECT_NE(message_of(r).find("differ from the baseline"), std::string::npos) << r.text;
  EXPECT_NE(message_of(r).find("dp0:pp0:pcp0:tp0:ep0:"), std::string::npos) << r.text;
  EXPECT_EQ(get("/weight_info").body["weight_version"], after_reset);
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["weight_update_session"], false);
  // SGLang's /weights_checker names parameters bare: the same baseline, this receiver's keys.
  ASSERT_EQ(post("/update_weights_from_disk", json{{"model_path", model_path()}}).status, 200);
  const json bare = post("/weights_checker", json::object()).body["ranks"][0]["checksums"];
  ASSERT_EQ(post("/start_weight_update").status, 200);
  r = post("/finish_weight_update", json{{"baseline", bare}});
  EXPECT_EQ(r.status, 200) << r.text;
  r = post("/finish_weight_update", json{{"baseline", {{"w", 3}}}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("baseline'['w']"), std::string::npos) << r.text;
}

TEST_F(VllmRoutes, SleepAndWakeUpByLevelAndTag) {
  const auto prints = serve_->fingerprints();
  EXPECT_EQ(get("/is_sleeping").body, json({{"is_sleeping", false}}));
  Reply r = post("/sleep?level=1");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_TRUE(r.text.empty()) << r.text;
  EXPECT_EQ(get("/is_sleeping").body, json({{"is_sleeping", true}}));
  EXPECT_EQ(get("/is_paused").body["is_paused"], true);  // a sleeping engine generates nothing
  EXPECT_EQ(get("/health").status, 503);
  EXPECT_EQ(post("/sleep?level=2").status, 200);  // already asleep: nothing changes (vLLM's)
  // verl wakes the weights first, then the KV cache.
  ASSERT_EQ(post("/wake_up?tags=weights").status, 200);
  EXPECT_EQ(get("/is_sleeping").body["is_sleeping"], true);
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(serve_->fingerprints(), prints);  // level 1: the weights came back from host memory
  EXPECT_EQ(post("/wake_up?tags=weights").status, 200);  // not asleep any more: nothing done
  ASSERT_EQ(post("/wake_up?tags=kv_cache").status, 200);
  EXPECT_EQ(get("/is_sleeping").body["is_sleeping"], false);
  EXPECT_EQ(get("/is_paused").body["is_paused"], false);
  EXPECT_EQ(post("/wake_up").status, 200);  // not asleep: nothing done

  // Level 2, every tag woken at once; this receiver's weights_policy is backup, so they return.
  ASSERT_EQ(post("/sleep?level=2&mode=keep").status, 200);
  EXPECT_EQ(get("/server_info").body["ferry"]["engine"]["pause_mode"], "in_place");
  ASSERT_EQ(post("/wake_up").status, 200);
  EXPECT_EQ(get("/is_sleeping").body["is_sleeping"], false);
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(serve_->fingerprints(), prints);
  r = post("/sleep?level=3");
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find("'level'"), std::string::npos) << r.text;
  EXPECT_EQ(get("/is_sleeping").body["is_sleeping"], false);
}

// docs/http-api.md's example round, request by request, with the answers it shows.
TEST_F(VllmRoutes, TheDocumentedRoundRuns) {
  Reply r = post("/pause?mode=abort");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"status", "paused"}}));
  r = post("/start_weight_update");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"message", "Weight update started"}}));
  ASSERT_EQ(post("/update_weights_from_disk", json{{"model_path", model_path()}}).status, 200);
  r = post("/finish_weight_update", json{{"weight_version", "step-12"}});
  ASSERT_EQ(r.status, 200) << r.text;
  r = post("/resume");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body, json({{"status", "resumed"}}));
  EXPECT_EQ(get("/weight_info").body, json({{"weight_version", "step-12"}}));
  r = post("/sleep?level=1");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_TRUE(r.text.empty()) << r.text;
  ASSERT_EQ(post("/wake_up?tags=weights").status, 200);
  ASSERT_EQ(post("/wake_up?tags=kv_cache").status, 200);
  EXPECT_EQ(get("/is_sleeping").body, json({{"is_sleeping", false}}));
  EXPECT_EQ(get("/is_paused").body, json({{"is_paused", false}}));
  EXPECT_EQ(get("/health").status, 200);
}

TEST(VllmSleep, LevelOneIsRefusedWhenTheWeightsWouldBeDropped) {
  TempDir dir;
  const auto checkpoint = make_dense_checkpoint(
      DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 5);
  write_checkpoint(dir.path() / "model", checkpoint, 1);
  ServeOptions o;
  o.model_path = (dir.path() / "model").string();
  o.sets.push_back("memory.weights_policy=discard");
  ServeProcess serve(o);
  Reply r = serve.post_raw("/sleep?level=1", "");
  EXPECT_EQ(r.status, 409) << r.text;
  EXPECT_NE(r.body.value("message", "").find("memory.weights_policy is 'discard'"),
            std::string::npos)
      << r.text;
  EXPECT_EQ(serve.get("/is_sleeping").body["is_sleeping"], false);
  EXPECT_EQ(serve.get("/is_paused").body["is_paused"], false);  // nothing paused either
  EXPECT_EQ(serve.get("/health").status, 200);
  // Level 2 drops them: asleep, and after the wake-up the weights wait for a full update.
  ASSERT_EQ(serve.post_raw("/sleep?level=2", "").status, 200);
  ASSERT_EQ(serve.post_raw("/wake_up", "").status, 200);
  EXPECT_EQ(serve.get("/health").body.value("state", ""), "invalid");
  ASSERT_EQ(serve.post("/update_weights_from_disk", json{{"model_path", o.model_path}}).status,
            200);
  EXPECT_EQ(serve.get("/health").status, 200);
}

}  // namespace
}  // namespace ferry::test
