// cli/cmd_version.cpp: `ferry version` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_version_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("version", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry version: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
