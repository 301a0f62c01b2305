// cli/cmd_inspect.cpp: `ferry inspect` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_inspect_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("inspect", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry inspect: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
