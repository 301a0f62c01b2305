// tests/common/run_command.hpp: runs a shell command line for a test and returns its exit status
// and what it printed (header-only). Include as "tests/common/run_command.hpp".
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ferry::test {

struct CommandResult {
  int status = -1;  // the exit status; -1 when it did not start or ended by a signal
  std::string out;  // its stdout (redirect 2>&1 in `command` for stderr too)
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace ferry::test
