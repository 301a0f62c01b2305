// tests/conformance/conformance_cli_test.cpp: runs the real `ferry conformance` on a conforming
// and a non-conforming plugin and checks its output and exit status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "../registry/plugin_files.hpp"

namespace {

using ::testing::HasSubstr;

struct CommandRun {
  int status = -1;
  std::string out;
};

CommandRun run_ferry(const std::string& args) {
  const auto exe = ferry::testing::env_dir("FERRY_EXE");
  const std::string command = "'" + exe.string() + "' " + args + " 2>/dev/null";
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

TEST(ConformanceCommand, ConformingPluginExitsZeroWithPassLines) {
  const CommandRun run =
      run_ferry("conformance '" + ferry::testing::mock_transport().string() + "'");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("PASS  FERRY-ABI-1 "));
  EXPECT_THAT(run.out, HasSubstr("PASS  FERRY-ABI-11 "));
  EXPECT_THAT(run.out, HasSubstr("PASS  FERRY-ABI-14 "));
  EXPECT_THAT(run.out, HasSubstr("14 passed, 0 failed"));
  EXPECT_THAT(run.out, HasSubstr("-> CONFORMS"));
}

TEST(ConformanceCommand, NonConformingPluginExitsOneAndNamesTheRequirement) {
  const CommandRun run =
      run_ferry("conformance '" + ferry::testing::broken("lenient").string() + "'");
  EXPECT_EQ(run.status, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("FAIL  FERRY-ABI-6 "));
  EXPECT_THAT(run.out, HasSubstr("DOES NOT CONFORM"));
}

TEST(ConformanceCommand, ListPrintsEveryRequirement) {
  const CommandRun run = run_ferry("conformance --list");
  EXPECT_EQ(run.status, 0);
  EXPECT_THAT(run.out, HasSubstr("FERRY-ABI-1 "));
  EXPECT_THAT(run.out, HasSubstr("FERRY-ABI-14 "));
}

}  // namespace
