// cli/cmd_serve.cpp: `ferry serve` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_serve_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("serve", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry serve: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
