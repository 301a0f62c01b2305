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
#include "config/config.hpp"
#include "ferry_build_config.h"

namespace {

// A subcommand's --help also lists the options of the commands above it (the global options),
// which it accepts after its own name too.
class HelpWithGlobalOptions : public CLI::Formatter {
 public:
  std::string make_footer(const CLI::App* app) const override {
    std::string out;
    for (const CLI::App* above = app->get_parent(); above != nullptr;
         above = above->get_parent()) {
      const auto options = above->get_options([above](const CLI::Option* option) {
        return option->nonpositional() && option != above->get_help_ptr() &&
               option != above->get_version_ptr();
      });
      if (options.empty()) continue;
      const std::string name = above->get_parent() == nullptr
                                   ? std::string("Global options (before or after the command)")
                                   : "Options of '" + above->get_name() + "' (also taken here)";
      out += make_group(name, false, options) + "\n";
    }
    return out + CLI::Formatter::make_footer(app);
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::cli;
  CLI::App app{"ferry: moves model weights from RL trainers into rollout engines"};
  app.formatter(std::make_shared<HelpWithGlobalOptions>());
  app.require_subcommand(1);
  GlobalOptions globals;
  app.add_option("--config", globals.config_path, "TOML config file (docs/config.md)");
  app.add_option("--set", globals.overrides, "config override KEY=VALUE (repeatable)");
  app.add_option("--plugin-dir", globals.plugin_dirs, "extra plugin folder, searched first");
  CLI::Option* log_level = app.add_option(
      "--log-level", globals.log_level,
      "trace, debug, info, warn, error, off (default: the config's log_level, else "
      "FERRY_LOG_LEVEL, else info)");
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION);
  // Hidden: stop after the command line parsed, naming the command (tests/docs checks every
  // command line the docs show this way, without running what needs peers or files).
  bool parse_only = false;
  app.add_flag("--parse-only", parse_only)->group("");
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
  if (parse_only) {
    std::string command;
    for (const CLI::App* sub = &app; sub != nullptr;) {
      const auto chosen = sub->get_subcommands();
      sub = chosen.empty() ? nullptr : chosen.front();
      if (sub != nullptr) command += (command.empty() ? "" : " ") + sub->get_name();
    }
    std::printf("ferry: parsed '%s'\n", command.c_str());
    return 0;
  }
  try {
    // --log-level, else the config's log_level (--set over FERRY_LOG_LEVEL over the file), else
    // info (docs/config.md, "The log level").
    if (log_level->count() == 0) {
      ferry::config::Config environment;
      ferry::config::apply_environment(environment);  // a bad FERRY_LOG_LEVEL stops any command
      globals.log_level = environment.log_level;
      try {
        globals.log_level = ferry::config::load(globals.config_path, globals.overrides).log_level;
      } catch (const ferry::Error&) {
        // Not an error here: the command that needs the config reports it.
      }
    }
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
