// config/plugin_sections.hpp: the config's [transport.<name>] and [model.<name>] sections held
// to the plugins the registry found, before anything is created: a section naming a plugin that
// was not found, or holding a key that plugin does not declare, stops the program with a
// message naming it (docs/config.md, "Plugin options").
#pragma once

#include "config/config.hpp"
#include "registry/registry.hpp"

namespace ferry::config {

// Checks every plugin section of `config`, whether or not its plugin is the one in use:
// - its plugin must be among those `registry` accepted (else NOT_FOUND with the registry's
//   message: the file name, the folders searched, what is available, why a file was refused);
// - each key must be one the plugin declares (plugin ABI 1.3, option_keys), else
//   INVALID_ARGUMENT naming where it was given, the key, the nearest declared key or the list.
// A plugin that declares no list is left to check its options when it is created.
void check_plugin_sections(const Config& config, const registry::Registry& registry);

}  // namespace ferry::config
