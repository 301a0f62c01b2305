// tests/disk/inspect_test.cpp: the real `ferry inspect` executable lists a good checkpoint
// (exit 0, text and JSON) and rejects a bad one naming the rule (exit 1).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <ferry/formats/safetensors.hpp>
#include "temp_dir.hpp"

namespace ferry {
namespace {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout, then stderr when merge_stderr
};

// Runs `ferry inspect <args>`; arguments are single-quoted for the shell.
ProcessResult run_inspect(const std::vector<std::string>& args, bool merge_stderr) {
  const char* exe = std::getenv("FERRY_EXE");
  if (exe == nullptr) {
    ADD_FAILURE() << "set FERRY_EXE to the ferry executable";
    return {};
  }
  std::string command = std::string("'") + exe + "' inspect";
  for (const auto& a : args) command += " '" + a + "'";
  command += merge_stderr ? " 2>&1" : " 2>/dev/null";
  ProcessResult run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed";
    return run;
  }
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto w = test::pattern_bytes(6 * 4, 1);
    const auto b = test::pattern_bytes(2 * 2, 2);
    const std::vector<safetensors::TensorData> tensors = {
        {"model.embed.weight", FERRY_DTYPE_F32, {2, 3}, w},
        {"model.norm.bias", FERRY_DTYPE_BF16, {2}, b}};
    safetensors::write_safetensors(good_, tensors, {{"format", "pt"}});
  }
  test::TempDir dir_;
  std::string good_ = dir_.file("good.safetensors");
};

TEST_F(InspectTest, ListsTensorsTotalsAndMetadata) {
  ProcessResult run = run_inspect({good_}, true);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("model.embed.weight"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[2, 3]"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("BF16"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("__metadata__ format = pt"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("total: 2 tensors, 28 bytes"), std::string::npos) << run.output;
}

TEST_F(InspectTest, JsonOutputDescribesEveryTensor) {
  ProcessResult run = run_inspect({good_, "--json"}, false);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto doc = nlohmann::json::parse(run.output);
  EXPECT_EQ(doc["tensor_count"], 2);
  EXPECT_EQ(doc["total_bytes"], 28);
  const auto& tensors = doc["files"][0]["tensors"];
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0]["name"], "model.embed.weight");
  EXPECT_EQ(tensors[0]["dtype"], "F32");
  EXPECT_EQ(tensors[0]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(tensors[0]["bytes"], 24);
  EXPECT_EQ(tensors[1]["data_offsets"], nlohmann::json::array({24, 28}));
  EXPECT_EQ(doc["files"][0]["metadata"]["format"], "pt");
}

TEST_F(InspectTest, BadFileExitsOneNamingTheRule) {
  const std::string bad = dir_.file("bad.safetensors");
  test::write_raw(bad, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12);
  ProcessResult run = run_inspect({bad}, true);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find(bad), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("tensor 'w'"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("span 12 bytes but shape [2, 2] of F32 needs 16 bytes"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("CORRUPT_DATA"), std::string::npos) << run.output;
}

// A config.json given where a safetensors file belongs is named as such, not as a header of an
// absurd length.
TEST_F(InspectTest, ATextFileIsNamedAsNotSafetensors) {
  const std::string config = dir_.file("config.json");
  {
    std::FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"hidden_size\": 4096\n}\n", f);
    std::fclose(f);
  }
  ProcessResult run = run_inspect({config}, true);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("not a safetensors file: it starts with text"), std::string::npos)
      << run.output;
}

TEST_F(InspectTest, MissingPathExitsOne) {
  ProcessResult run = run_inspect({dir_.file("absent")}, true);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("no such file or directory"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace ferry
