// Tests of the receiver with its weights on a GPU (receiver.device = cuda): disk updates of a
// dense checkpoint (engine layout: fused, strided copies; several dtypes) land bit-identical to
// the CPU receiver's, get_weights_by_name and fingerprints read device weights, 100
// release/resume cycles (backup policy) leak no device or page-locked memory, and `ferry serve
// --device cuda` serves the same fingerprints. Exits 77 (meson's skip code) without a CUDA
// device.
#include "config/config.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using receiver::Receiver;

constexpr std::uint64_t kMiB = 1ull << 20;

// Norms in F32, embeddings in F16, everything else BF16.
ferry_dtype_t dtype_of(const std::string& name) {
  if (name.find("norm") != std::string::npos) return FERRY_DTYPE_F32;
  if (name.find("embed") != std::string::npos) return FERRY_DTYPE_F16;
  return FERRY_DTYPE_BF16;
}

DenseShape shape() {
  DenseShape s;
  s.vocab = 512;
  s.hidden = 256;
  s.q_rows = 256;
  s.kv_rows = 128;
  s.head_dim = 64;
  s.intermediate = 512;
  s.layers = 4;
  return s;
}

std::map<std::string, std::uint64_t> expected_fingerprints(const Checkpoint& c) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& [name, bytes] : dense_expected_params(c, "engine", 0, 1)) {
    out[name] = kernels::fingerprint_cpu(bytes.data(), bytes.size(), 1);
  }
  return out;
}

std::uint64_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

std::uint64_t free_device_bytes() {
  std::size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

class CudaReceiver : public ::testing::Test {
 protected:
  void SetUp() override {
    v1_ = make_dense_checkpoint(shape(), dtype_of, 41);
    v2_ = make_dense_checkpoint(shape(), dtype_of, 42);
    write_checkpoint(dir_.path() / "v1", v1_, 2);
    write_checkpoint(dir_.path() / "v2", v2_, 1);
    const fs::path disk = required_env("FERRY_DISK_PLUGIN");
    const fs::path dense = required_env("FERRY_DENSE_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), dense.parent_path()});
  }

  std::unique_ptr<Receiver> make(const std::string& device, config::ReleasePolicy policy) {
    config::Config config;
    config.receiver.device = device;
    config.receiver.model_family = "dense";
    config.receiver.layout = config::Layout::engine;
    config.memory.weights_policy = policy;
    config.update.bucket_bytes = 1 * kMiB;  // several buckets: the double buffering is used
    return std::make_unique<Receiver>(config, *registry_);
  }

  TempDir dir_;
  Checkpoint v1_, v2_;
  std::unique_ptr<registry::Registry> registry_;
};

TEST_F(CudaReceiver, DiskUpdatesLandBitIdenticalToTheCpuReceiver) {
  auto cpu = make("cpu", config::ReleasePolicy::discard);
  auto gpu = make("cuda:0", config::ReleasePolicy::discard);
  for (const char* version : {"v1", "v2", "v1"}) {
    const auto cpu_report = cpu->update_from_disk(dir_.path() / version, std::string(version));
    const auto gpu_report = gpu->update_from_disk(dir_.path() / version, std::string(version));
    EXPECT_EQ(gpu_report.version.number, cpu_report.version.number);
    EXPECT_GT(gpu_report.buckets, 1u);
    const auto expected = expected_fingerprints(std::string(version) == "v2" ? v2_ : v1_);
    EXPECT_EQ(gpu->fingerprints(), expected) << version;
    EXPECT_EQ(cpu->fingerprints(), expected) << version;
    EXPECT_TRUE(gpu->health().ready) << gpu->health().reason;
  }
  // get_weights_by_name reads device weights through the store (the same values as the CPU's).
  for (const auto& t : v1_.tensors) {
    const auto g = gpu->weights_by_name(t.name, receiver::Receiver::kMaxWeightValues);
    const auto c = cpu->weights_by_name(t.name, receiver::Receiver::kMaxWeightValues);
    EXPECT_EQ(g.shape, c.shape) << t.name;
    ASSERT_EQ(g.values.size(), c.values.size()) << t.name;
    for (std::size_t i = 0; i < g.values.size(); ++i) {
      ASSERT_EQ(g.values[i], c.values[i]) << t.name << " element " << i;
      ASSERT_EQ(g.values[i], decode_element(t.dtype, t.bytes.data(), i)) << t.name;
    }
  }
}

TEST_F(CudaReceiver, HundredReleaseResumeCyclesLeakNoDeviceOrPinnedMemory) {
  auto gpu = make("cuda", config::ReleasePolicy::backup);
  gpu->update_from_disk(dir_.path() / "v1", std::string("v1"));
  gpu->release({});
  gpu->resume({});
  gpu->update_from_disk(dir_.path() / "v2", std::string("v2"));
  gpu->release({});
  gpu->resume({});
  const std::uint64_t free_before = free_device_bytes();
  const std::uint64_t rss_before = status_kib("VmRSS");
  const std::uint64_t locked_before = status_kib("VmLck") + status_kib("VmPin");
  for (int cycle = 0; cycle < 100; ++cycle) {
    gpu->release({});
    ASSERT_EQ(gpu->health().state, "released");
    gpu->resume({});
  }
  EXPECT_TRUE(gpu->health().ready) << gpu->health().reason;
  EXPECT_EQ(gpu->fingerprints(), expected_fingerprints(v2_));
  EXPECT_LE(free_before, free_device_bytes() + 64 * kMiB) << "device memory shrank";
  EXPECT_EQ(status_kib("VmLck") + status_kib("VmPin"), locked_before);
  EXPECT_LE(status_kib("VmRSS"), rss_before + 64 * 1024) << "RSS grew by more than 64 MiB";
}

TEST_F(CudaReceiver, ServeWithDeviceCudaServesTheCheckpointsFingerprints) {
  ServeOptions options;
  options.model_path = (dir_.path() / "v1").string();
  options.sets = {"receiver.device=cuda:0"};
  ServeProcess serve(options);
  const auto expected = expected_fingerprints(v1_);
  auto served = serve.fingerprints();
  ASSERT_EQ(served.size(), expected.size());
  for (const auto& [name, value] : expected) {
    EXPECT_EQ(served[name], fmt::format("{:016x}", value)) << name;
  }
  ASSERT_EQ(serve.update_from_disk((dir_.path() / "v2").string()).status, 200);
  served = serve.fingerprints();
  for (const auto& [name, value] : expected_fingerprints(v2_)) {
    EXPECT_EQ(served[name], fmt::format("{:016x}", value)) << name;
  }
}

}  // namespace
}  // namespace ferry::test
