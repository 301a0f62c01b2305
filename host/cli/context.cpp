// The config and plugin registry shared by the subcommands (see cli/context.hpp).
#include "cli/context.hpp"

#include "cli/plugin_search.hpp"
#include "config/plugin_sections.hpp"

namespace ferry::cli {

config::Config load_config(const GlobalOptions& globals) {
  config::Config config = config::load(globals.config_path, globals.overrides);
  config.log_level = globals.log_level;  // main() resolved it: --log-level over the config
  return config;
}

std::unique_ptr<registry::Registry> make_registry(const GlobalOptions& globals,
                                                  const config::Config& config) {
  auto registry =
      std::make_unique<registry::Registry>(plugin_search_path(globals, config.plugin_dirs));
  config::check_plugin_sections(config, *registry);
  return registry;
}

}  // namespace ferry::cli
