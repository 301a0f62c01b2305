// cli/cmd_demo.cpp: `ferry demo` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_demo_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("demo", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry demo: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
