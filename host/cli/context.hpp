// cli/context.hpp: what most subcommands start from: the config (file + --set overrides) and a
// plugin registry scanned in the documented search order.
#pragma once

#include <memory>

#include "cli/command.hpp"
#include "config/config.hpp"
#include "registry/registry.hpp"

namespace ferry::cli {

// --config, FERRY_LOG_LEVEL and --set applied in order, then validated; log_level is the one in
// force (globals.log_level, which main() resolved).
config::Config load_config(const GlobalOptions& globals);

// --plugin-dir folders, then config plugin_dirs, then FERRY_PLUGIN_PATH, the install directory
// and the in-tree build folders. Every [transport.<name>] / [model.<name>] section of `config` is
// checked against the plugins found (config/plugin_sections.hpp).
std::unique_ptr<registry::Registry> make_registry(const GlobalOptions& globals,
                                                  const config::Config& config);

}  // namespace ferry::cli
