// The config and plugin registry shared by the subcommands (see cli/context.hpp).
#include "cli/context.hpp"

namespace ferry::cli {

config::Config load_config(const GlobalOptions& globals) {
  return config::load(globals.config_path, globals.overrides);
}

std::unique_ptr<registry::Registry> make_registry(const GlobalOptions& globals,
                                                  const config::Config& config) {
  std::vector<std::filesystem::path> first;
  for (const auto& d : globals.plugin_dirs) first.emplace_back(d);
  for (const auto& d : config.plugin_dirs) first.emplace_back(d);
  std::vector<std::filesystem::path> last;
  // A relocated install (scripts/bundle): plugins beside the executable.
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) last.push_back(exe.parent_path().parent_path() / "lib" / "ferry" / "plugins");
  for (const auto& d : in_tree_plugin_dirs()) last.emplace_back(d);
  return std::make_unique<registry::Registry>(
      registry::Registry::default_search_path(first, last));
}

}  // namespace ferry::cli
