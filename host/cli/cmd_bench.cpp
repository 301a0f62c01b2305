// cli/cmd_bench.cpp: `ferry bench` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_bench_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("bench", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry bench: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
