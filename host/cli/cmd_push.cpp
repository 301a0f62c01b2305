// cli/cmd_push.cpp: `ferry push` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_push_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("push", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry push: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
