// Round trip through a real `ferry serve`: every value read back with /get_weights_by_name, and
// every parameter's fingerprint, equals what the checkpoint holds (this rank's shard), for all
// twelve dtypes, both layouts (engine, hf) and tensor parallelism 1, 2 and 4 (one process per
// rank).
#include <ferry/kernels/cpu.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

// Every dtype appears; parts of a fused engine parameter (q/k/v, gate/up) share one.
ferry_dtype_t dtype_of(const std::string& name) {
  static const std::map<std::string, ferry_dtype_t> by_suffix0 = {
      {"input_layernorm.weight", FERRY_DTYPE_F64},  {"self_attn.q_proj.weight", FERRY_DTYPE_BF16},
      {"self_attn.k_proj.weight", FERRY_DTYPE_BF16}, {"self_attn.v_proj.weight", FERRY_DTYPE_BF16},
      {"self_attn.q_norm.weight", FERRY_DTYPE_F16},  {"self_attn.k_norm.weight", FERRY_DTYPE_I64},
      {"self_attn.o_proj.weight", FERRY_DTYPE_I32},  {"post_attention_layernorm.weight", FERRY_DTYPE_I16},
      {"mlp.gate_proj.weight", FERRY_DTYPE_I8},      {"mlp.up_proj.weight", FERRY_DTYPE_I8},
      {"mlp.down_proj.weight", FERRY_DTYPE_U8},
  };
  static const std::map<std::string, ferry_dtype_t> by_suffix1 = {
      {"input_layernorm.weight", FERRY_DTYPE_BOOL},     {"self_attn.q_proj.weight", FERRY_DTYPE_F8_E4M3},
      {"self_attn.k_proj.weight", FERRY_DTYPE_F8_E4M3}, {"self_attn.v_proj.weight", FERRY_DTYPE_F8_E4M3},
      {"self_attn.q_norm.weight", FERRY_DTYPE_F8_E5M2}, {"self_attn.k_norm.weight", FERRY_DTYPE_F32},
      {"self_attn.o_proj.weight", FERRY_DTYPE_F16},     {"post_attention_layernorm.weight", FERRY_DTYPE_BF16},
      {"mlp.gate_proj.weight", FERRY_DTYPE_F8_E5M2},    {"mlp.up_proj.weight", FERRY_DTYPE_F8_E5M2},
      {"mlp.down_proj.weight", FERRY_DTYPE_F64},
  };
  if (name == "model.embed_tokens.weight") return FERRY_DTYPE_F32;
  if (name == "model.norm.weight") return FERRY_DTYPE_F8_E4M3;
  if (name == "lm_head.weight") return FERRY_DTYPE_I64;
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  if (name.starts_with(l0)) return by_suffix0.at(name.substr(l0.size()));
  if (name.starts_with(l1)) return by_suffix1.at(name.substr(l1.size()));
  throw std::runtime_error("no dtype for " + name);
}

// The safetensors spelling of a dtype (what /get_weights_by_name answers).
std::string safetensors_name(ferry_dtype_t dtype) {
  static const char* const names[] = {"INVALID", "F64", "F32",  "F16",     "BF16",   "I64", "I32",
                                      "I16",     "I8",  "U8",   "BOOL",    "F8_E4M3", "F8_E5M2"};
  return names[static_cast<int>(dtype)];
}

struct Case {
  std::string layout;
  unsigned tp_size;
};

class ServeRoundTrip : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(make_dense_checkpoint(DenseShape{}, dtype_of, 7));
    write_checkpoint(dir_->path() / "single", *checkpoint_, 1);
    write_checkpoint(dir_->path() / "sharded", *checkpoint_, 3);
  }
  static void TearDownTestSuite() {
    checkpoint_.reset();
    dir_.reset();
  }
  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
};
std::unique_ptr<TempDir> ServeRoundTrip::dir_;
std::unique_ptr<Checkpoint> ServeRoundTrip::checkpoint_;

TEST_P(ServeRoundTrip, EveryValueOfEveryRankEqualsTheCheckpointShard) {
  const Case c = GetParam();
  // Alternate the single-file and the sharded (index json) checkpoint, and the explicit and the
  // detected (config.json) model family, across the cases.
  const bool sharded = (c.layout == "engine") == (c.tp_size == 2);
  const std::string path = (dir_->path() / (sharded ? "sharded" : "single")).string();

  std::vector<std::unique_ptr<ServeProcess>> ranks;
  for (unsigned r = 0; r < c.tp_size; ++r) {
    ServeOptions o;
    o.model_path = path;
    o.layout = c.layout;
    o.tp_rank = r;
    o.tp_size = c.tp_size;
    o.model_family = c.layout == "engine" ? "dense" : "";
    ranks.push_back(std::make_unique<ServeProcess>(o));
  }

  for (unsigned r = 0; r < c.tp_size; ++r) {
    const ServeProcess& serve = *ranks[r];
    SCOPED_TRACE(fmt::format("{} layout, tp rank {}/{}", c.layout, r, c.tp_size));
    const Reply health = serve.get("/health");
    ASSERT_EQ(health.status, 200) << health.text;
    const Reply version = serve.get("/get_weight_version");
    ASSERT_EQ(version.status, 200);
    EXPECT_EQ(version.body["version"].get<std::uint64_t>(), 1u);

    for (const Tensor& t : checkpoint_->tensors) {
      SCOPED_TRACE(t.name);
      const auto shard = dense_expected_shard(t, r, c.tp_size);
      const std::uint64_t count = t.elements() / (dense_shard_dim(t.name) < 0 ? 1 : c.tp_size);
      const Reply reply = serve.weights(t.name, 1u << 16);  // the maximum: every value here
      ASSERT_EQ(reply.status, 200) << reply.text;
      const json& body = reply.body;
      EXPECT_EQ(body["name"].get<std::string>(), t.name);
      const std::string dtype = body["dtype"].get<std::string>();
      EXPECT_EQ(dtype, safetensors_name(t.dtype));
      EXPECT_EQ(body["shape"].get<std::vector<std::uint64_t>>(), dense_shard_shape(t, c.tp_size));
      const auto values = body["values"].get<std::vector<double>>();
      ASSERT_EQ(values.size(), count);
      std::size_t mismatches = 0;
      for (std::uint64_t i = 0; i < count; ++i) {
        const double want = decode_element(t.dtype, shard.data(), i);
        ASSERT_FALSE(std::isnan(want));
        if (values[i] != want && mismatches++ < 3) {
          ADD_FAILURE() << dtype << " element " << i << ": got " << values[i] << ", want "
                        << want;
        }
      }
      EXPECT_EQ(mismatches, 0u);

      // truncate_size: exactly the first values (all of them when the shard is shorter).
      const Reply head = serve.weights(t.name, 3);
      ASSERT_EQ(head.status, 200) << head.text;
      const auto first = head.body["values"].get<std::vector<double>>();
      ASSERT_EQ(first.size(), std::min<std::uint64_t>(3, count));
      for (std::uint64_t i = 0; i < first.size(); ++i) {
        EXPECT_EQ(first[i], decode_element(t.dtype, shard.data(), i));
      }
    }

    // Whole parameters, byte for byte: the fingerprint of the expected bytes of each parameter
    // (fused in the engine layout) equals the receiver's.
    const auto prints = serve.fingerprints();
    const auto params = dense_expected_params(*checkpoint_, c.layout, r, c.tp_size);
    EXPECT_EQ(prints.size(), params.size());
    for (const auto& [name, bytes] : params) {
      ASSERT_TRUE(prints.count(name)) << "no parameter " << name;
      EXPECT_EQ(prints.at(name),
                fmt::format("{:016x}", kernels::fingerprint_cpu(bytes.data(), bytes.size(), 1)))
          << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndRanks, ServeRoundTrip,
                         ::testing::Values(Case{"engine", 1}, Case{"engine", 2}, Case{"engine", 4},
                                           Case{"hf", 1}, Case{"hf", 2}, Case{"hf", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.layout + "_tp" + std::to_string(info.param.tp_size);
                         });

TEST(ServeRoundTripChecks, DecoderReadsKnownBitPatterns) {
  // The test's own decoder, checked against values written out by hand, so a wrong decoder
  // cannot make the round trip agree with a wrong receiver.
  const std::uint8_t bf16[] = {0x80, 0x3F};  // 0x3F80 = 1.0
  EXPECT_EQ(decode_element(FERRY_DTYPE_BF16, bf16, 0), 1.0);
  const std::uint8_t f16[] = {0x00, 0xC0, 0x01, 0x00};  // 0xC000 = -2.0, 0x0001 = 2^-24
  EXPECT_EQ(decode_element(FERRY_DTYPE_F16, f16, 0), -2.0);
  EXPECT_EQ(decode_element(FERRY_DTYPE_F16, f16, 1), std::ldexp(1.0, -24));
  const std::uint8_t e4m3[] = {0x38, 0x7E, 0x01};  // 1.0, 448 (largest), 2^-9
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E4M3, e4m3, 0), 1.0);
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E4M3, e4m3, 1), 448.0);
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E4M3, e4m3, 2), std::ldexp(1.0, -9));
  const std::uint8_t e5m2[] = {0x3C, 0x7B, 0x81};  // 1.0, 57344 (largest), -2^-16
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E5M2, e5m2, 0), 1.0);
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E5M2, e5m2, 1), 57344.0);
  EXPECT_EQ(decode_element(FERRY_DTYPE_F8_E5M2, e5m2, 2), -std::ldexp(1.0, -16));
  const std::uint8_t i16[] = {0xFE, 0xFF};
  EXPECT_EQ(decode_element(FERRY_DTYPE_I16, i16, 0), -2.0);
}

}  // namespace
}  // namespace ferry::test
