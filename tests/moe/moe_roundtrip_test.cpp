// MoE checkpoints (E = 8, 64, 128 experts) loaded from real safetensors files through the real
// receiver (disk transport + the built MoE plugin), for EP 1, 2, 4 x TP 1, 2, every rank: each
// stacked w13/w2 parameter equals the experts of that rank's range in slot order (gate rows then
// up rows, this TP rank's part), and get_weights_by_name on an expert's checkpoint name returns
// its values (NOT_FOUND naming the owner for another rank's expert).
#include "moe_checkpoint.hpp"

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

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw std::runtime_error(std::string(name) + " is not set (meson test sets it)");
  return v;
}

double bf16_value(std::uint16_t v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint64_t print_of(const std::vector<std::uint16_t>& v) {
  return kernels::fingerprint_cpu(v.data(), v.size() * 2, 1);
}

class MoeRoundTrip : public ::testing::TestWithParam<std::uint64_t> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("ferry_moe_rt_{}_{}", getpid(), GetParam());
    shape_.experts = GetParam();
    tensors_ = make_moe_checkpoint(shape_, 100 + GetParam());
    write_moe_checkpoint(dir_, shape_, tensors_);
    const fs::path disk = env("FERRY_DISK_PLUGIN");
    const fs::path moe = env("FERRY_MOE_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), moe.parent_path()});
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<receiver::Receiver> load(std::uint32_t er, std::uint32_t ep, std::uint32_t tr,
                                           std::uint32_t tp, const std::string& family = "") {
    config::Config c;
    c.receiver.model_family = family;  // "" : detected from config.json (Qwen3Moe -> moe)
    c.receiver.layout = config::Layout::engine;
    c.receiver.ep_rank = er;
    c.receiver.ep_size = ep;
    c.receiver.tp_rank = tr;
    c.receiver.tp_size = tp;
    c.update.apply_threads = 2;
    c.update.read_threads = 1;
    c.update.bucket_bytes = 64 << 10;  // several buckets, each mixing layers and experts
    auto r = std::make_unique<receiver::Receiver>(c, *registry_);
    const auto report = r->update_from_disk(dir_, "v1");
    EXPECT_EQ(report.version.number, 1u);
    return r;
  }

  fs::path dir_;
  MoeShape shape_;
  std::map<std::string, Tensor> tensors_;
  std::unique_ptr<registry::Registry> registry_;
};

TEST_P(MoeRoundTrip, EveryExpertLandsInItsSlotOnEveryRank) {
  const std::uint64_t e_count = GetParam();
  for (std::uint32_t ep : {1u, 2u, 4u}) {
    for (std::uint32_t tp : {1u, 2u}) {
      for (std::uint32_t er = 0; er < ep; ++er) {
        for (std::uint32_t tr = 0; tr < tp; ++tr) {
          SCOPED_TRACE(fmt::format("E {} ep {}/{} tp {}/{}", e_count, er, ep, tr, tp));
          auto r = load(er, ep, tr, tp, (er + tr) % 2 == 0 ? "" : "moe");
          const auto prints = r->fingerprints();
          for (std::uint32_t l = 0; l < shape_.layers; ++l) {
            const auto [w13, w2] = expected_stacked(tensors_, shape_, l, er, ep, tr, tp);
            const std::string p = fmt::format("model.layers.{}.mlp.", l);
            ASSERT_TRUE(prints.count(p + "experts.w13_weight"));
            EXPECT_EQ(prints.at(p + "experts.w13_weight"), print_of(w13));
            EXPECT_EQ(prints.at(p + "experts.w2_weight"), print_of(w2));
            EXPECT_EQ(prints.at(p + "gate.weight"), print_of(tensors_.at(p + "gate.weight").bf16));
          }
          // get_weights_by_name: first and last local expert's up_proj (this TP rank's rows).
          const std::uint64_t local = e_count / ep, shard = shape_.inter / tp;
          for (std::uint64_t e : {er * local, (er + 1) * local - 1}) {
            const std::string name = fmt::format("model.layers.1.mlp.experts.{}.up_proj.weight", e);
            const auto values = r->weights_by_name(name, 1 << 20);
            const auto want = slice(tensors_.at(name), tr * shard, (tr + 1) * shard, 0, shape_.hidden);
            ASSERT_EQ(values.values.size(), want.size()) << name;
            for (std::size_t i = 0; i < want.size(); ++i) {
              ASSERT_EQ(values.values[i], bf16_value(want[i])) << name << " element " << i;
            }
            EXPECT_EQ(values.shape, (std::vector<std::uint64_t>{shard, shape_.hidden}));
          }
          if (ep > 1) {
            const std::uint64_t other = ((er + 1) % ep) * local;
            try {
              r->weights_by_name(fmt::format("model.layers.0.mlp.experts.{}.down_proj.weight", other), 4);
              ADD_FAILURE() << "another rank's expert was found";
            } catch (const Error& e) {
              EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
              EXPECT_NE(std::string(e.what()).find(fmt::format("ep rank {}", (er + 1) % ep)),
                        std::string::npos)
                  << e.what();
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeRoundTrip, ::testing::Values(8, 64, 128),
                         [](const ::testing::TestParamInfo<std::uint64_t>& info) {
                           return "E" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ferry::moe_test
