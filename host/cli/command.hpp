// cli/command.hpp: how subcommands of the `ferry` command plug into main.cpp. Each cmd_*.cpp
// adds one subcommand to the CLI11 app and sets the action run when it is chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "cli/global_options.hpp"

namespace ferry::cli {

// An action returns the process exit code. Exceptions (ferry::Error) are caught by main.
using Action = std::function<int()>;

// Each adds its subcommand to `app` and returns the action; `globals` stays valid for the life of
// the program. Defined in cmd_<name>.cpp.
Action add_plugins_command(CLI::App& app, const GlobalOptions& globals);
Action add_version_command(CLI::App& app, const GlobalOptions& globals);
Action add_conformance_command(CLI::App& app, const GlobalOptions& globals);
Action add_inspect_command(CLI::App& app, const GlobalOptions& globals);
Action add_serve_command(CLI::App& app, const GlobalOptions& globals);
Action add_push_command(CLI::App& app, const GlobalOptions& globals);
Action add_demo_command(CLI::App& app, const GlobalOptions& globals);
Action add_bench_command(CLI::App& app, const GlobalOptions& globals);

// Search order for plugins given the globals and config (registry::default_search_path plus the
// in-tree build folders when running from the build tree).
std::vector<std::string> in_tree_plugin_dirs();

}  // namespace ferry::cli
