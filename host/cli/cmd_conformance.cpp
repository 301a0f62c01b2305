// cli/cmd_conformance.cpp: `ferry conformance` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_conformance_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("conformance", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry conformance: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
