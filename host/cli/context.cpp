// The config and plugin registry shared by the subcommands (see cli/context.hpp).
#include "cli/context.hpp"

#include "cli/plugin_search.hpp"

namespace ferry::cli {

config::Config load_config(const GlobalOptions& globals) {
  return config::load(globals.config_path, globals.overrides);
}

std::unique_ptr<registry::Registry> make_registry(const GlobalOptions& globals,
                                                  const config::Config& config) {
  return std::make_unique<registry::Registry>(plugin_search_path(globals, config.plugin_dirs));
}

}  // namespace ferry::cli
