// tests/config/cli_config_test.cpp: the real `ferry` executable and its config: the log level
// from --log-level, --set, FERRY_LOG_LEVEL and the file, in that order; plugin sections refused
// before anything starts; every subcommand's --help listing the global options; the demo's
// transports from the config's one list; `ferry bench` running ferry-bench with its command line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "config/config.hpp"
#include "tests/common/run_command.hpp"

using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using CommandRun = ferry::test::CommandResult;

// `ferry ARGS` under `env` (e.g. "FERRY_LOG_LEVEL=debug"), killed after 30 s (status 124);
// stdout and stderr together.
CommandRun ferry(const std::string& args, const std::string& env = "") {
  return ferry::test::run_command("env -u FERRY_LOG_LEVEL " + env + " timeout 30 '" +
                                  std::string(std::getenv("FERRY_EXE")) + "' " + args + " 2>&1");
}

class ConfigFile {
 public:
  explicit ConfigFile(const std::string& text) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "ferry-cli-config-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());
    ::close(fd);
    path_ = pattern;
    std::ofstream(path_) << text;
  }
  ~ConfigFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `ferry plugins` logs each plugin it loads at debug.
constexpr const char* kDebugLine = "[debug] loaded transport plugin 'disk'";

TEST(CliLogLevel, TheConfigFileAndSetAreHonoured) {
  EXPECT_THAT(ferry("plugins").out, Not(HasSubstr(kDebugLine)));
  EXPECT_THAT(ferry("--set log_level=debug plugins").out, HasSubstr(kDebugLine));
  EXPECT_THAT(ferry("plugins --set log_level=debug").out, HasSubstr(kDebugLine));
  const ConfigFile debug("log_level = \"debug\"\n");
  EXPECT_THAT(ferry("--config " + debug.path() + " plugins").out, HasSubstr(kDebugLine));
}

TEST(CliLogLevel, PrecedenceIsFlagThenSetThenEnvironmentThenFile) {
  const ConfigFile warn("log_level = \"warn\"\n");
  const ConfigFile debug("log_level = \"debug\"\n");
  // --log-level over --set.
  EXPECT_THAT(ferry("--log-level warn --set log_level=debug plugins").out,
              Not(HasSubstr(kDebugLine)));
  EXPECT_THAT(ferry("--log-level debug --config " + warn.path() + " plugins").out,
              HasSubstr(kDebugLine));
  // --set over FERRY_LOG_LEVEL.
  EXPECT_THAT(ferry("--set log_level=warn plugins", "FERRY_LOG_LEVEL=debug").out,
              Not(HasSubstr(kDebugLine)));
  // FERRY_LOG_LEVEL over the file.
  EXPECT_THAT(ferry("--config " + warn.path() + " plugins", "FERRY_LOG_LEVEL=debug").out,
              HasSubstr(kDebugLine));
  EXPECT_THAT(ferry("--config " + debug.path() + " plugins", "FERRY_LOG_LEVEL=warn").out,
              Not(HasSubstr(kDebugLine)));
}

TEST(CliLogLevel, ABadLevelIsNamed) {
  const CommandRun env = ferry("plugins", "FERRY_LOG_LEVEL=chatty");
  EXPECT_EQ(env.status, 1) << env.out;
  EXPECT_THAT(env.out, HasSubstr("FERRY_LOG_LEVEL: 'log_level' must be one of trace, debug, "
                                 "info, warn, error, off; got 'chatty'"));
  const CommandRun set = ferry("--set log_level=loud serve --port 0");
  EXPECT_EQ(set.status, 1) << set.out;
  EXPECT_THAT(set.out, HasSubstr("--set log_level=loud: 'log_level' must be one of"));
}

TEST(CliPluginSections, AnUnknownPluginOptionStopsServeBeforeItStarts) {
  const CommandRun moe = ferry("--set model.moe.fuse_experts=false serve --port 0");
  EXPECT_EQ(moe.status, 1) << moe.out;
  EXPECT_THAT(moe.out, HasSubstr("ferry: error: --set model.moe.fuse_experts=false: unknown key "
                                 "'model.moe.fuse_experts' (options of model plugin 'moe'"));
  const ConfigFile odirect("[transport.disk]\nodirect = true\n");
  const CommandRun disk = ferry("serve --port 0 --config " + odirect.path());
  EXPECT_EQ(disk.status, 1) << disk.out;
  EXPECT_THAT(disk.out, HasSubstr(odirect.path() + ":2: unknown key 'transport.disk.odirect'"));
  const CommandRun missing = ferry("--set transport.rdma9.queues=4 serve --port 0");
  EXPECT_EQ(missing.status, 1) << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("section [transport.rdma9]: no transport plugin 'rdma9'"));
  EXPECT_THAT(missing.out, HasSubstr("(NOT_FOUND)"));
}

TEST(CliHelp, EverySubcommandListsTheGlobalOptions) {
  for (const char* command : {"serve", "push", "demo", "plugins", "inspect", "conformance",
                              "version", "bench", "bench scatter"}) {
    const CommandRun help = ferry(std::string(command) + " --help");
    EXPECT_EQ(help.status, 0) << command << ": " << help.out;
    EXPECT_THAT(help.out, HasSubstr("Global options (before or after the command):")) << command;
    for (const char* option : {"--config", "--set", "--plugin-dir", "--log-level"}) {
      EXPECT_THAT(help.out, HasSubstr(option)) << command;
    }
  }
}

TEST(CliHelp, TheDemoRefusesABroadcastTransport) {
  const CommandRun nccl = ferry("demo --transport nccl");
  EXPECT_EQ(nccl.status, 1) << nccl.out;
  // Refused by its capabilities (not point-to-point), or as missing in a build without NCCL.
  EXPECT_THAT(nccl.out, testing::AnyOf(HasSubstr("ferry demo drives point-to-point pushes only; "
                                                 "transport 'nccl' is not one"),
                                       HasSubstr("transport 'nccl' is not available")));
}

TEST(CliParseOnly, NamesTheCommandAndRunsNothing) {
  const CommandRun run = ferry("--parse-only serve --port 1 --model-path /nonexistent");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_EQ(run.out, "ferry: parsed 'serve'\n");
  EXPECT_EQ(ferry("--parse-only bench scatter").out, "ferry: parsed 'bench scatter'\n");
  EXPECT_NE(ferry("--parse-only serve --no-such-option").status, 0);
}

// `ferry bench` is ferry-bench (bench/): the cases, their options and their records are its,
// and the records name the command as the user typed it.
TEST(CliBench, RunsFerryBenchWithItsCommandLine) {
  const CommandRun help = ferry("bench --help");
  EXPECT_EQ(help.status, 0) << help.out;
  for (const char* name : {"scatter", "cuda_ipc", "embedded", "store"}) {
    EXPECT_THAT(help.out, HasSubstr("  " + std::string(name) + " ")) << help.out;
  }
  const std::string json =
      (std::filesystem::temp_directory_path() / ("ferry-cli-bench-" + std::to_string(::getpid()) +
                                                 ".json"))
          .string();
  const std::string args = "bench moe --device cpu --no-torch --repeat 1 --warmup 1 --json " + json;
  const CommandRun run = ferry(args);
  EXPECT_EQ(run.status, 0) << run.out;
  std::ifstream in(json);
  const std::string records((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(json);
  EXPECT_THAT(records, HasSubstr("\"command\": \"" + std::string(std::getenv("FERRY_EXE")) + " " +
                                 args + "\""));
  EXPECT_THAT(records, HasSubstr("\"verified\": true"));
}

// The RL loop of `ferry bench cuda_ipc --release-each-step` on the CPU (inline into a CPU
// receiver): before each timed push the receiver releases and resumes its weights and KV cache,
// and every push after a resume still commits verified weights.
TEST(CliBench, TheRlLoopReleasesAndResumesBeforeEachVerifiedPush) {
  const std::string json =
      (std::filesystem::temp_directory_path() /
       ("ferry-cli-bench-rl-" + std::to_string(::getpid()) + ".json"))
          .string();
  const CommandRun run = ferry("bench cuda_ipc --device cpu --release-each-step --no-torch "
                               "--repeat 2 --tensors 4 --total-gib 0.01 --json " + json);
  EXPECT_EQ(run.status, 0) << run.out;
  std::ifstream in(json);
  const auto records = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(json);
  ASSERT_TRUE(records.is_array() && records.size() == 1) << run.out;
  const auto& r = records[0];
  EXPECT_EQ(r.value("release_each_step", false), true);
  ASSERT_TRUE(r.contains("ferry") && r["ferry"].size() == 1) << r.dump();
  const auto& f = r["ferry"][0];
  EXPECT_EQ(f.value("verified", false), true) << f.dump();
  EXPECT_EQ(f["release"]["runs_seconds"].size(), 2u) << f.dump();
  EXPECT_EQ(f["resume"]["runs_seconds"].size(), 2u) << f.dump();
  EXPECT_EQ(f["runs_seconds"].size(), 2u) << f.dump();
  EXPECT_TRUE(f.contains("pushes_through_kept_session")) << f.dump();
  EXPECT_THAT(run.out, HasSubstr("after a release")) << run.out;
}

// A ferry without its ferry-bench (copied alone) says so and names where it looked.
TEST(CliBench, WithoutFerryBenchItSaysWhereItLooked) {
  const std::filesystem::path prefix = std::filesystem::temp_directory_path() /
                                       ("ferry-cli-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(prefix / "bin");
  std::filesystem::copy_file(std::getenv("FERRY_EXE"), prefix / "bin" / "ferry");
  const CommandRun run = ferry::test::run_command("'" + (prefix / "bin" / "ferry").string() +
                                                  "' bench scatter --device cpu 2>&1");
  std::filesystem::remove_all(prefix);
  EXPECT_EQ(run.status, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("ferry bench: the benchmark program ferry-bench was not found"));
  EXPECT_THAT(run.out, HasSubstr((prefix / "libexec" / "ferry" / "ferry-bench").string()));
}

}  // namespace
