// capi/config_source.cpp: config and plugin registry for the C API handles (config_source.hpp).
#include "capi/config_source.hpp"


#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "capi/capi_boundary.hpp"
#include "common/log.hpp"
#include "config/plugin_sections.hpp"
#include "ferry_capi_in_tree_plugins.h"

namespace ferry::capi {
namespace {

// The folder holding libferry.so itself, found through one of its own symbols.
std::filesystem::path library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&ferry_api_version), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  std::error_code ec;
  const auto path = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path() : path.parent_path();
}

std::vector<std::filesystem::path> split_dirs(const std::string& joined) {
  std::vector<std::filesystem::path> dirs;
  std::size_t start = 0;
  while (start <= joined.size()) {
    const auto end = std::min(joined.find(':', start), joined.size());
    if (end > start) dirs.emplace_back(joined.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

}  // namespace

config::Config load_config(const ferry_config_source_t* source, const char* function) {
  // An embedding program has no --log-level: FERRY_LOG_LEVEL ("debug", "warn", ...) sets it,
  // over the config's file or text and under its overrides (docs/config.md, "The log level").
  // Where none of them names a level, a library in someone else's process logs warnings and
  // errors only: what each session did is for those who ask (info, debug).
  auto quiet_unless_given = [](config::Config& config) {
    if (!config.log_level_given) config.log_level = "warn";
  };
  auto environment = [function](config::Config& config) {
    try {
      config::apply_environment(config);
    } catch (const Error& e) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {}", function, e.what());
    }
  };
  if (source == nullptr) {
    config::Config defaults;
    environment(defaults);
    quiet_unless_given(defaults);
    config::validate(defaults);
    set_log_level(defaults.log_level);
    return defaults;
  }
  const ferry_config_source_t s =
      read_struct(source, FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides), function,
                  "config");
  if (s.path != nullptr && s.toml_text != nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: config gives both path '{}' and toml_text; pass one",
         function, s.path);
  }
  if (s.num_overrides > 0 && s.overrides == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: config overrides is NULL with {} overrides",
         function, s.num_overrides);
  }
  config::Config config;
  if (s.path != nullptr) {
    config = config::load_file(s.path);
  } else if (s.toml_text != nullptr) {
    config = config::parse(s.toml_text, "<toml_text>");
  }
  environment(config);
  for (std::size_t i = 0; i < s.num_overrides; ++i) {
    if (s.overrides[i] == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: config override {} is NULL", function, i);
    }
    config::apply_override(config, s.overrides[i]);
  }
  quiet_unless_given(config);
  config::validate(config);
  set_log_level(config.log_level);
  return config;
}

std::unique_ptr<registry::Registry> make_registry(const config::Config& config) {
  const std::vector<std::filesystem::path> config_dirs(config.plugin_dirs.begin(),
                                                       config.plugin_dirs.end());
  std::vector<std::filesystem::path> last;
  // A relocated copy (an install, or the Python package's bundled copy): plugins beside the
  // library in ferry/plugins (lib/libferry.so + lib/ferry/plugins) or plugins/.
  const auto here = library_dir();
  if (!here.empty()) {
    last.push_back(here / "ferry" / "plugins");
    last.push_back(here / "plugins");
  }
  for (auto& dir : split_dirs(FERRY_CAPI_IN_TREE_PLUGIN_DIRS)) last.push_back(std::move(dir));
  auto registry = std::make_unique<registry::Registry>(
      registry::Registry::default_search_path(config_dirs, last));
  for (const auto& refusal : registry->refused()) {
    logger("capi")->debug("plugin refused: {}", refusal.describe());
  }
  config::check_plugin_sections(config, *registry);
  return registry;
}

}  // namespace ferry::capi
