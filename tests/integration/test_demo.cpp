// tests/integration/test_demo.cpp: `ferry demo` as a user runs it: the real executable, which
// starts a real `ferry serve` child, on a tiny model in a temporary work folder; checks the exit
// code, the per-step lines, the final table, the checkpoint cache, and the failures: a receiver
// that cannot start, a receiver holding other bytes, and options the demo refuses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct DemoRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

std::string quote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class DemoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* exe = std::getenv("FERRY_EXE");
    ASSERT_NE(exe, nullptr) << "FERRY_EXE must name the ferry executable (meson sets it)";
    exe_ = exe;
    std::random_device rd;
    work_ = fs::temp_directory_path() / ("ferry-demo-test-" + std::to_string(rd()));
    fs::create_directories(work_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(work_, ec);
  }

  // Runs `ferry demo` on the tiny model in the work folder with `extra` arguments.
  // `globals` go before the subcommand (--set, --config).
  DemoRun demo(const std::vector<std::string>& extra,
               const std::vector<std::string>& globals = {}) const {
    std::string command = quote(exe_);
    for (const auto& a : globals) command += " " + quote(a);
    command += " demo --hidden-size 128 --layers 2 --vocab-size 512 --work-dir " +
               quote(work_.string());
    for (const auto& a : extra) command += " " + quote(a);
    command += " 2>&1";
    DemoRun run;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return run;
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
    const int status = ::pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return run;
  }

  std::string exe_;
  fs::path work_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(DemoTest, TwoStepsAreDeliveredVerifiedAndTabulated) {
  const DemoRun run = demo({"--steps", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("receiver: initial weights verified"), std::string::npos) << run.output;
  EXPECT_TRUE(std::regex_search(run.output,
                                std::regex(R"(step 1/2: version step-1, [0-9.]+ MiB in [0-9.]+ s \([0-9.]+ GB/s\), release\+resume [0-9.]+ s, verified)")))
      << run.output;
  EXPECT_TRUE(std::regex_search(run.output, std::regex(R"(step 2/2: version step-2, .*, verified\n)")))
      << run.output;
  EXPECT_TRUE(std::regex_search(run.output,
                                std::regex(R"(step +version +bytes +seconds +GB/s +verified\n)")))
      << run.output;
  // The tiny model is 2 x (q 128x128, k/v 64x128, o 128x128, gate/up/down 384x128, norms) plus
  // embedding and lm_head 512x128 and the final norm, all BF16: 525,184 elements, 1,050,368
  // bytes = 1.0 MiB per update.
  EXPECT_TRUE(std::regex_search(run.output, std::regex(R"(\n +1 +step-1 +1\.0 MiB +[0-9.]+ +[0-9.]+ +yes\n)")))
      << run.output;
  EXPECT_TRUE(std::regex_search(run.output, std::regex(R"(\n +2 +step-2 +1\.0 MiB +[0-9.]+ +[0-9.]+ +yes\n)")))
      << run.output;
  EXPECT_EQ(count(run.output, "NOT verified"), 0u) << run.output;
  EXPECT_NE(run.output.find("all 2 steps verified"), std::string::npos) << run.output;
  // The initial checkpoint is cached (sharded, with index and config); step checkpoints are not.
  EXPECT_TRUE(fs::exists(work_ / "initial" / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(work_ / "initial" / "model-00002-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(work_ / "initial" / "config.json"));
  EXPECT_FALSE(fs::exists(work_ / "step-1"));
  EXPECT_FALSE(fs::exists(work_ / "step-2"));
}

TEST_F(DemoTest, SecondRunReusesTheCachedInitialCheckpoint) {
  const DemoRun first = demo({"--steps", "1"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("wrote the initial checkpoint"), std::string::npos) << first.output;
  const DemoRun second = demo({"--steps", "1"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("reusing the cached initial checkpoint"), std::string::npos)
      << second.output;
  EXPECT_EQ(second.output.find("wrote the initial checkpoint"), std::string::npos) << second.output;
}

TEST_F(DemoTest, CorruptedCacheIsRegeneratedAndTheRunStillVerifies) {
  const DemoRun first = demo({"--steps", "1"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Flip the last data byte of the last shard: the header stays valid, only the weights change.
  const fs::path shard = work_ / "initial" / "model-00002-of-00002.safetensors";
  char original = 0;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(-1, std::ios::end);
    f.get(original);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(original ^ 0x40));
  }
  const DemoRun second = demo({"--steps", "1"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("is not usable (the bytes of tensor lm_head.weight"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("wrote the initial checkpoint"), std::string::npos) << second.output;
  std::ifstream f(shard, std::ios::binary);
  f.seekg(-1, std::ios::end);
  char restored = 0;
  f.get(restored);
  EXPECT_EQ(restored, original);
}

TEST_F(DemoTest, KeepLeavesEveryStepCheckpoint) {
  const DemoRun run = demo({"--steps", "2", "--keep", "--transport", "disk"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* step : {"step-1", "step-2"}) {
    EXPECT_TRUE(fs::exists(work_ / step / "model.safetensors.index.json")) << step;
    EXPECT_TRUE(fs::exists(work_ / step / "model-00001-of-00002.safetensors")) << step;
  }
}

// The default transport on a CPU receiver is UCX (the first of update.transport_preference that
// fits host memory) when its plugin is built, else inline; every transport the demo drives
// delivers and verifies a step.
TEST_F(DemoTest, AutoPicksUcxWhenBuiltAndEveryTransportVerifies) {
  const char* have_ucx = std::getenv("FERRY_TEST_HAVE_UCX");
  const bool ucx = have_ucx != nullptr && std::string(have_ucx) == "1";
  const DemoRun automatic = demo({"--steps", "1"});
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  EXPECT_NE(automatic.output.find(ucx ? "over transport 'ucx'" : "over transport 'inline'"),
            std::string::npos)
      << automatic.output;
  for (const char* transport : {"disk", "inline"}) {
    const DemoRun run = demo({"--steps", "1", "--transport", transport});
    ASSERT_EQ(run.exit_code, 0) << transport << "\n" << run.output;
    EXPECT_NE(run.output.find(std::string("over transport '") + transport + "'"),
              std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("the step verified"), std::string::npos) << run.output;
  }
}

// --device cuda: on a machine with a GPU the loop runs on it and verifies the step; without a
// usable GPU (or in a build without CUDA) it is refused before any checkpoint is written, with
// the device and the reason named.
TEST_F(DemoTest, CudaDeviceRunsOnAGpuAndIsRefusedClearlyWithoutOne) {
  const DemoRun run = demo({"--steps", "1", "--device", "cuda"});
  const auto has = [&](const char* text) { return run.output.find(text) != std::string::npos; };
  if (run.exit_code == 0) {
    EXPECT_TRUE(has("' on cuda")) << run.output;
    EXPECT_TRUE(has("ferry demo: the step verified")) << run.output;
    return;
  }
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(has("ferry demo: device 'cuda:0'")) << run.output;
  const bool no_gpu = has("no CUDA device is usable here") && has("(NOT_FOUND)");
  const bool no_cuda_build = has("built without CUDA support") && has("(UNIMPLEMENTED)");
  EXPECT_TRUE(no_gpu || no_cuda_build) << run.output;
  EXPECT_FALSE(fs::exists(work_ / "initial"));
}

// A receiver that cannot start (here its host mirror file lies in a missing folder, a real
// misconfiguration forwarded through --set) fails the demo with the receiver's exit status and
// its own error, instead of a hang.
TEST_F(DemoTest, ReceiverThatCannotStartIsReportedWithItsError) {
  const std::string mirror = (work_ / "missing-folder" / "mirror").string();
  const DemoRun run = demo({"--steps", "1"}, {"--set", "memory.mirror_path=" + mirror});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("FAILED: the receiver (ferry serve, pid "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("exited with status 1 before it was ready"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("| ferry: error: initial load of"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("missing-folder"), std::string::npos) << run.output;
}

// A receiver told to cast its parameters to F32 (a real dense-model option) holds other bytes
// than the BF16 the trainer sent: the demo must report the mismatch, never "verified".
TEST_F(DemoTest, ReceiverHoldingOtherBytesFailsVerification) {
  const DemoRun run = demo({"--steps", "1"}, {"--set", "model.dense.dtype=F32"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("FAILED: the receiver's initial weights are not the trainer's: "
                            "fingerprint mismatch: 19 of 19 parameters differ: lm_head.weight"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("verified in"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("step 1/1"), std::string::npos) << run.output;
}

TEST_F(DemoTest, UnknownTransportIsRefused) {
  const DemoRun run = demo({"--steps", "1", "--transport", "pigeon"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  // No such plugin: refused by name before anything starts.
  EXPECT_NE(run.output.find("ferry demo: transport 'pigeon' is not available: "),
            std::string::npos)
      << run.output;
}

}  // namespace
