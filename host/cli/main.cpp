// cli/main.cpp: the `ferry` command: parses global options and dispatches to a subcommand.
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/command_suggestion.hpp"
#include "common/log.hpp"
#include "ferry_build_config.h"

int main(int argc, char** argv) {
  using namespace ferry::cli;
  CLI::App app{"ferry: moves model weights from RL trainers into rollout engines"};
  app.require_subcommand(1);
  GlobalOptions globals;
  app.add_option("--config", globals.config_path, "TOML config file (docs/config.md)");
  app.add_option("--set", globals.overrides, "config override KEY=VALUE (repeatable)");
  app.add_option("--plugin-dir", globals.plugin_dirs, "extra plugin folder, searched first");
  app.add_option("--log-level", globals.log_level, "trace, debug, info, warn, error, off");
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION);
  // Global options are taken after the command too (`ferry serve --config F`).
  app.fallthrough();

  std::map<CLI::App*, Action> actions;
  auto add = [&](Action (*adder)(CLI::App&, const GlobalOptions&)) {
    const auto before = app.get_subcommands({});
    Action action = adder(app, globals);
    for (CLI::App* sub : app.get_subcommands({})) {
      bool seen = false;
      for (CLI::App* old : before) seen = seen || old == sub;
      if (!seen) actions[sub] = action;
    }
  };
  add(add_plugins_command);
  add(add_version_command);
  add(add_conformance_command);
  add(add_inspect_command);
  add(add_serve_command);
  add(add_push_command);
  add(add_demo_command);
  add(add_bench_command);

  // A mistyped command gets the nearest one named, not only "A subcommand is required".
  if (const auto word = command_word(argc, argv)) {
    std::vector<std::string> known;
    for (CLI::App* sub : app.get_subcommands({})) known.push_back(sub->get_name());
    if (std::find(known.begin(), known.end(), *word) == known.end()) {
      const auto near = nearest_command(*word, known);
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "ferry: error: '%s' is not a ferry command%s (commands: %s)\n",
                   word->c_str(),
                   near ? (std::string("; did you mean '") + *near + "'?").c_str() : "",
                   list.c_str());
      return 2;
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    ferry::set_log_level(globals.log_level);
    for (auto& [sub, action] : actions) {
      if (sub->parsed()) return action();
    }
    return 2;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry: error: %s (%s)\n", e.what(), ferry::status_name(e.code()));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 1;
  }
}
