// cli/cmd_plugins.cpp: `ferry plugins` (placeholder until its issue lands).
#include <cstdio>

#include "cli/command.hpp"

namespace ferry::cli {

Action add_plugins_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("plugins", "not implemented yet");
  return [] {
    std::fprintf(stderr, "ferry plugins: not implemented yet\n");
    return 2;
  };
}

}  // namespace ferry::cli
