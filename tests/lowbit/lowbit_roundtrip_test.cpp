// A bf16 MoE checkpoint quantized on arrival by the low-bit plugin inside the real receiver
// (disk transport, in-process): every stacked expert weight and its scales equal the
// independent float64 reference of the formula (tests/kernels/fp8_reference.hpp) for this
// rank's experts and TP part; ue8m0 scales are powers of two; re-applying the same checkpoint
// leaves every byte (weights and scales) the same.
#include "../kernels/fp8_reference.hpp"
#include "../moe/moe_checkpoint.hpp"

#include "config/config.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

namespace ferry::moe_test {
namespace {

namespace fs = std::filesystem;
namespace ref = ferry::fp8_reference;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw std::runtime_error(std::string(name) + " is not set (meson test sets it)");
  return v;
}

// A shape whose every part is a whole number of 128-row blocks (stacked experts need N % 128 == 0,
// see models/lowbit/README.md; partial blocks are covered by the kernel tests), with experts of
// 256 rows (two TP halves of 128).
MoeShape lowbit_shape() {
  MoeShape s;
  s.experts = 4;
  s.hidden = 384;
  s.inter = 256;
  s.q_rows = 256;
  s.kv_rows = 256;
  s.heads = 2;
  s.kv_heads = 2;
  s.head_dim = 128;
  s.vocab = 64;
  s.layers = 1;
  return s;
}

struct Case {
  std::uint32_t ep_rank, ep_size, tp_rank, tp_size;
  bool ue8m0;
};

class LowbitRoundTrip : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("ferry_lowbit_rt_{}", getpid());
    tensors_ = make_moe_checkpoint(shape_, 7);
    write_moe_checkpoint(dir_, shape_, tensors_);
    const fs::path disk = env("FERRY_DISK_PLUGIN");
    const fs::path lowbit = env("FERRY_LOWBIT_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), lowbit.parent_path()});
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  MoeShape shape_ = lowbit_shape();
  std::map<std::string, Tensor> tensors_;
  std::unique_ptr<registry::Registry> registry_;
};

// The bytes of a receiver parameter, through get_weights_by_name-free access: fingerprints are
// compared, so the expected bytes are built here.
std::uint64_t print_of(const void* data, std::size_t bytes) {
  return kernels::fingerprint_cpu(data, bytes, 1);
}

TEST_P(LowbitRoundTrip, ExpertsQuantizeToTheReferenceAndReapplyIsIdentical) {
  const Case c = GetParam();
  config::Config cfg;
  cfg.receiver.model_family = "lowbit";
  cfg.receiver.ep_rank = c.ep_rank;
  cfg.receiver.ep_size = c.ep_size;
  cfg.receiver.tp_rank = c.tp_rank;
  cfg.receiver.tp_size = c.tp_size;
  cfg.update.apply_threads = 2;
  cfg.update.bucket_bytes = 256 << 10;
  if (c.ue8m0) cfg.models["lowbit"]["scale_fmt"] = "ue8m0";
  receiver::Receiver r(cfg, *registry_);
  r.update_from_disk(dir_, "v1");
  const auto first = r.fingerprints();

  // Expected: per local expert, the reference quantization of [gate part; up part] and of the
  // down part, stacked.
  const auto [w13, w2] =
      expected_stacked(tensors_, shape_, 0, c.ep_rank, c.ep_size, c.tp_rank, c.tp_size);
  const std::uint64_t local = shape_.experts / c.ep_size;
  const std::uint64_t rows13 = 2 * shape_.inter / c.tp_size, h = shape_.hidden;
  const std::uint64_t cols2 = shape_.inter / c.tp_size;
  std::vector<std::uint8_t> q13, q2;
  std::vector<float> s13, s2;
  auto quantize = [&](const std::vector<std::uint16_t>& all, std::uint64_t e, std::uint64_t rows,
                      std::uint64_t cols, std::vector<std::uint8_t>& q, std::vector<float>& s) {
    std::vector<double> values(rows * cols);
    for (std::uint64_t i = 0; i < values.size(); ++i) {
      values[i] = ref::bf16_value(all[e * rows * cols + i]);
    }
    const ref::Quantized out = ref::quantize_matrix(values, rows, cols, c.ue8m0);
    q.insert(q.end(), out.q.begin(), out.q.end());
    s.insert(s.end(), out.scales.begin(), out.scales.end());
  };
  for (std::uint64_t e = 0; e < local; ++e) {
    quantize(w13, e, rows13, h, q13, s13);
    quantize(w2, e, h, cols2, q2, s2);
  }
  const std::string p = "model.layers.0.mlp.experts.";
  EXPECT_EQ(first.at(p + "w13_weight"), print_of(q13.data(), q13.size()));
  EXPECT_EQ(first.at(p + "w13_weight_scale_inv"), print_of(s13.data(), s13.size() * 4));
  EXPECT_EQ(first.at(p + "w2_weight"), print_of(q2.data(), q2.size()));
  EXPECT_EQ(first.at(p + "w2_weight_scale_inv"), print_of(s2.data(), s2.size() * 4));
  if (c.ue8m0) {
    for (float s : s13) {
      int e = 0;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << s;
    }
  }
  // get_weights_by_name on an expert answers with its FP8 codes' values.
  const std::uint64_t e0 = c.ep_rank * local;
  const auto values = r.weights_by_name(fmt::format("{}{}.gate_proj.weight", p, e0), 8);
  ASSERT_EQ(values.values.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    const std::uint8_t code = q13[i];
    EXPECT_EQ(values.values[i], (code & 0x80 ? -1.0 : 1.0) * ref::e4m3_code_value(code & 0x7f) ) << i;
  }
  // Unquantized parameters stay bf16 and exact.
  const auto& router = tensors_.at("model.layers.0.mlp.gate.weight").bf16;
  EXPECT_EQ(first.at("model.layers.0.mlp.gate.weight"), print_of(router.data(), router.size() * 2));

  r.update_from_disk(dir_, "v2");
  EXPECT_EQ(r.version().number, 2u);
  EXPECT_EQ(r.fingerprints(), first);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LowbitRoundTrip,
                         ::testing::Values(Case{0, 1, 0, 1, false}, Case{1, 2, 0, 1, true},
                                           Case{0, 1, 1, 2, false}, Case{1, 2, 1, 2, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return fmt::format("ep{}of{}_tp{}of{}{}", c.ep_rank, c.ep_size,
                                              c.tp_rank, c.tp_size, c.ue8m0 ? "_ue8m0" : "");
                         });

}  // namespace
}  // namespace ferry::moe_test
