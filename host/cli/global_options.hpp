// cli/global_options.hpp: the options `ferry` takes before (or after) any command, and what runs
// around a command: the help that lists them under every command, --parse-only, the log level in
// force and the one-line error. ferry-bench (bench/main.cpp), which `ferry bench` runs, takes
// them the same way.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace ferry::cli {

// Options every subcommand shares (parsed before the subcommand runs).
struct GlobalOptions {
  std::string config_path;              // --config FILE
  std::vector<std::string> overrides;   // --set key=value (config overrides)
  std::vector<std::string> plugin_dirs; // --plugin-dir DIR (prepended to the search order)
  std::string log_level = "info";
  bool parse_only = false;              // hidden --parse-only: stop once the command line parsed
  // Not an option: the `ferry` executable whose install or bundle holds the plugins
  // (plugin_search_path looks in ../lib/ferry/plugins beside it). Empty: this process's
  // executable; ferry-bench sets the ferry it belongs to.
  std::filesystem::path ferry_exe;
};

// Adds the global options, --version and the hidden --parse-only to the root `app`, the help
// formatter that lists them under every subcommand, and fallthrough (so that they are taken after
// the command too). Returns the --log-level option (run_command needs to know if it was given).
// `globals` must outlive the parse.
CLI::Option* add_global_options(CLI::App& app, GlobalOptions& globals);

// "ferry: parsed 'bench scatter'": the chain of subcommands chosen under `app` (tests/docs checks
// every command line the docs show this way, without running what needs peers or files).
void print_parsed(const CLI::App& app);

// Sets the log level in force (--log-level, else the config's log_level: --set over
// FERRY_LOG_LEVEL over the file, else info; docs/config.md, "The log level") and runs `action`.
// A ferry::Error or std::exception from either is printed as "ferry: error: ..." and gives 1.
int run_command(GlobalOptions& globals, const CLI::Option& log_level,
                const std::function<int()>& action);

}  // namespace ferry::cli
