// cli/global_options.cpp: the global options of `ferry` and ferry-bench, and what runs around a
// command (see global_options.hpp).
#include "cli/global_options.hpp"

#include <ferry/sdk/error.hpp>

#include <cstdio>
#include <memory>

#include "common/log.hpp"
#include "config/config.hpp"
#include "ferry_build_config.h"

namespace ferry::cli {
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

CLI::Option* add_global_options(CLI::App& app, GlobalOptions& globals) {
  app.formatter(std::make_shared<HelpWithGlobalOptions>());
  app.add_option("--config", globals.config_path, "TOML config file (docs/config.md)");
  app.add_option("--set", globals.overrides, "config override KEY=VALUE (repeatable)");
  app.add_option("--plugin-dir", globals.plugin_dirs, "extra plugin folder, searched first");
  CLI::Option* log_level = app.add_option(
      "--log-level", globals.log_level,
      "trace, debug, info, warn, error, off (default: the config's log_level, else "
      "FERRY_LOG_LEVEL, else info)");
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION);
  app.add_flag("--parse-only", globals.parse_only)->group("");
  // Global options are taken after the command too (`ferry serve --config F`).
  app.fallthrough();
  return log_level;
}

void print_parsed(const CLI::App& app) {
  std::string command;
  for (const CLI::App* sub = &app; sub != nullptr;) {
    const auto chosen = sub->get_subcommands();
    sub = chosen.empty() ? nullptr : chosen.front();
    if (sub != nullptr) command += (command.empty() ? "" : " ") + sub->get_name();
  }
  std::printf("ferry: parsed '%s'\n", command.c_str());
}

int run_command(GlobalOptions& globals, const CLI::Option& log_level,
                const std::function<int()>& action) {
  try {
    // --log-level, else the config's log_level (--set over FERRY_LOG_LEVEL over the file), else
    // info (docs/config.md, "The log level").
    if (log_level.count() == 0) {
      config::Config environment;
      config::apply_environment(environment);  // a bad FERRY_LOG_LEVEL stops any command
      globals.log_level = environment.log_level;
      try {
        globals.log_level = config::load(globals.config_path, globals.overrides).log_level;
      } catch (const Error&) {
        // Not an error here: the command that needs the config reports it.
      }
    }
    set_log_level(globals.log_level);
    return action();
  } catch (const Error& e) {
    std::fprintf(stderr, "ferry: error: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace ferry::cli
