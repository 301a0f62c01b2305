// config/plugin_sections.cpp: plugin sections checked against the registry (plugin_sections.hpp).
#include "config/plugin_sections.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>

#include "config/suggest.hpp"

namespace ferry::config {
namespace {

std::string origin(const Config& config, const std::string& path) {
  const auto it = config.origins.find(path);
  return it == config.origins.end() ? std::string("config") : it->second;
}

void check_group(const Config& config, const registry::Registry& registry,
                 ferry_plugin_kind_t kind, const std::map<std::string, PluginOptions>& sections) {
  const char* group = kind == FERRY_PLUGIN_TRANSPORT ? "transport" : "model";
  for (const auto& [name, options] : sections) {
    const std::string section = fmt::format("{}.{}", group, name);
    std::shared_ptr<registry::LoadedPlugin> plugin;
    try {
      plugin = kind == FERRY_PLUGIN_TRANSPORT ? registry.transport(name) : registry.model(name);
    } catch (const Error& e) {
      fail(e.code(), "{}: section [{}]: {}", origin(config, section), section, e.what());
    }
    const auto& declared = plugin->info().option_keys;
    if (!declared) continue;  // an older plugin: its create checks the keys
    for (const auto& [key, value] : options) {
      if (std::find(declared->begin(), declared->end(), key) != declared->end()) continue;
      const std::string path = fmt::format("{}.{}", section, key);
      const std::string plugin_name = fmt::format("{} plugin '{}', {}", group, name,
                                                  plugin->info().path.string());
      if (declared->empty()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: unknown key '{}' ({}, takes no options)",
             origin(config, path), path, plugin_name);
      }
      std::string known;
      for (const auto& k : *declared) known += (known.empty() ? "" : ", ") + k;
      const auto near = nearest(key, *declared);
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: unknown key '{}'{} (options of {}: {})",
           origin(config, path), path,
           near ? fmt::format("; did you mean '{}.{}'?", section, *near) : std::string(),
           plugin_name, known);
    }
  }
}

}  // namespace

void check_plugin_sections(const Config& config, const registry::Registry& registry) {
  check_group(config, registry, FERRY_PLUGIN_TRANSPORT, config.transports);
  check_group(config, registry, FERRY_PLUGIN_MODEL, config.models);
}

}  // namespace ferry::config
