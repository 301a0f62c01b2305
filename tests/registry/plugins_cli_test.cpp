// tests/registry/plugins_cli_test.cpp: runs the real `ferry plugins` and `ferry version`
// executables against a folder of mocks and broken plugins and checks what they print.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include <ferry/plugin.h>

#include "plugin_files.hpp"

namespace {

// The ABI version this tree builds ("1.2").
const std::string kAbi =
    std::to_string(FERRY_PLUGIN_ABI_MAJOR) + "." + std::to_string(FERRY_PLUGIN_ABI_MINOR);

using ferry::testing::TempDir;
using ::testing::HasSubstr;

struct CommandRun {
  int status = -1;
  std::string out;
};

// Runs `ferry ARGS` with FERRY_PLUGIN_PATH unset; captures stdout (stderr carries the logs), or
// stderr alone.
// `stderr_only`: captures stderr instead (stdout discarded).
CommandRun run_ferry(const std::string& args, bool stderr_only = false) {
  const auto exe = ferry::testing::env_dir("FERRY_EXE");
  const std::string command = "env -u FERRY_PLUGIN_PATH '" + exe.string() + "' " + args +
                              (stderr_only ? " 2>&1 >/dev/null" : " 2>/dev/null");
  CommandRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class PluginsCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.folder("plugins");
    ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir_);
    ferry::testing::copy_plugin(ferry::testing::mock_model(), dir_);
    ferry::testing::copy_plugin(ferry::testing::broken("wrongmajor"), dir_);
    ferry::testing::copy_plugin(ferry::testing::broken("alpha"), dir_);
    ferry::testing::write_text_plugin(dir_, "libferry_transport_text.so");
  }

  TempDir tmp_;
  std::filesystem::path dir_;
};

TEST_F(PluginsCommand, JsonListsMocksWithCapabilitiesAndRefusalsWithReasons) {
  const CommandRun run = run_ferry("--plugin-dir '" + dir_.string() + "' plugins --json");
  ASSERT_EQ(run.status, 0) << run.out;
  const auto doc = nlohmann::json::parse(run.out);
  ASSERT_FALSE(doc["search_dirs"].empty());
  EXPECT_EQ(doc["search_dirs"][0], dir_.string());

  int mocks = 0;
  for (const auto& plugin : doc["plugins"]) {
    if (plugin["path"].get<std::string>().rfind(dir_.string(), 0) != 0) continue;  // in-tree ones
    ++mocks;
    EXPECT_EQ(plugin["name"], "mock");
    EXPECT_EQ(plugin["abi"], kAbi);
    EXPECT_EQ(plugin["version"], "0.1-test");
    if (plugin["kind"] == "transport") {
      EXPECT_EQ(plugin["path"], (dir_ / "libferry_transport_mock.so").string());
      EXPECT_EQ(plugin["capabilities"], nlohmann::json::array({"p2p"}));
      EXPECT_EQ(plugin["memory_kinds"], nlohmann::json::array({"host", "pinned"}));
      EXPECT_EQ(plugin["max_inflight_buckets"], 1);
    } else {
      EXPECT_EQ(plugin["kind"], "model");
      EXPECT_FALSE(plugin.contains("capabilities"));
    }
  }
  EXPECT_EQ(mocks, 2);

  std::map<std::string, std::string> reasons;
  for (const auto& refusal : doc["refused"]) {
    reasons[std::filesystem::path(refusal["path"].get<std::string>()).filename().string()] =
        refusal["reason"].get<std::string>();
  }
  EXPECT_THAT(reasons["libferry_transport_wrongmajor.so"], HasSubstr("implements plugin ABI 2."));
  EXPECT_THAT(reasons["libferry_transport_alpha.so"], HasSubstr("reports name 'beta'"));
  EXPECT_THAT(reasons["libferry_transport_text.so"], HasSubstr("not a loadable shared object"));
}

TEST_F(PluginsCommand, TableShowsCapabilityWordsAndRefusedLines) {
  const CommandRun run = run_ferry("--plugin-dir '" + dir_.string() + "' plugins");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("NAME"));
  EXPECT_THAT(run.out, HasSubstr("host,pinned"));
  EXPECT_THAT(run.out, HasSubstr("refused:\n"));
  EXPECT_THAT(run.out, HasSubstr((dir_ / "libferry_transport_wrongmajor.so").string() +
                                 ": implements plugin ABI 2."));
}

// Plugins that abort, crash or hang while loading are listed as refused with what happened; the
// command itself goes on (before they were vetted in a child process, it died or never returned).
TEST_F(PluginsCommand, CrashingAndHangingPluginsAreNamedAndTheListGoesOn) {
  ferry::testing::copy_plugin(ferry::testing::broken("ctorabort"), dir_);
  ferry::testing::copy_plugin(ferry::testing::broken("negsegv"), dir_);
  ferry::testing::copy_plugin(ferry::testing::broken("negspin", "model"), dir_);
  const CommandRun run = run_ferry("--plugin-dir '" + dir_.string() + "' plugins --json");
  ASSERT_EQ(run.status, 0) << run.out;
  const auto doc = nlohmann::json::parse(run.out);
  std::map<std::string, std::string> reasons;
  for (const auto& refusal : doc["refused"]) {
    reasons[std::filesystem::path(refusal["path"].get<std::string>()).filename().string()] =
        refusal["reason"].get<std::string>();
  }
  EXPECT_THAT(reasons["libferry_transport_ctorabort.so"],
              HasSubstr("crashed with SIGABRT (Aborted) while being loaded"));
  EXPECT_THAT(reasons["libferry_transport_negsegv.so"],
              HasSubstr("crashed with SIGSEGV (Segmentation fault) in ferry_plugin_negotiate"));
  EXPECT_THAT(reasons["libferry_model_negspin.so"],
              HasSubstr("did not return within 4 s in ferry_plugin_negotiate"));
  bool mock_listed = false;
  for (const auto& plugin : doc["plugins"]) mock_listed = mock_listed || plugin["name"] == "mock";
  EXPECT_TRUE(mock_listed) << run.out;
}

TEST(VersionCommand, PrintsVersionAbiAndFeatures) {
  const CommandRun run = run_ferry("version");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("ferry 0.1.0\n"));
  EXPECT_THAT(run.out, HasSubstr("plugin ABI " + kAbi));
  EXPECT_THAT(run.out, HasSubstr("features: cuda "));
}

TEST(VersionCommand, VersionFlagPrintsTheVersion) {
  const CommandRun run = run_ferry("--version");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("ferry 0.1.0"));
}

// A mistyped command is named with the nearest one; global options are taken after the command.
TEST(CommandLine, AMistypedCommandSuggestsTheNearestAndGlobalOptionsGoAnywhere) {
  const CommandRun typo = run_ferry("--log-level warn srve", true);
  EXPECT_EQ(typo.status, 2) << typo.out;
  EXPECT_THAT(typo.out, HasSubstr("'srve' is not a ferry command; did you mean 'serve'?"));
  const CommandRun far = run_ferry("frobnicate", true);
  EXPECT_EQ(far.status, 2) << far.out;
  EXPECT_THAT(far.out, HasSubstr("'frobnicate' is not a ferry command (commands: "));
  const CommandRun after = run_ferry("version --log-level warn");
  EXPECT_EQ(after.status, 0) << after.out;
  EXPECT_THAT(after.out, HasSubstr("ferry 0.1.0\n"));
}

}  // namespace
