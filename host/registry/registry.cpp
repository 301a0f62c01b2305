// registry/registry.cpp: the search path and the scan that turns plugin folders into accepted
// plugins and refusals (see registry.hpp for the rules).
#include "registry/registry.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <sys/auxv.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "common/ferry_install_paths.h"
#include "common/log.hpp"
#include "ferry_build_config.h"
#include "registry/loader.hpp"
#include "registry/plugin_file.hpp"
#include "registry/vetting.hpp"

namespace ferry::registry {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> split_path_list(const std::string& text) {
  std::vector<fs::path> dirs;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto end = std::min(text.find(':', start), text.size());
    if (end > start) dirs.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

// Lexically normalized absolute form, used to scan a folder listed twice only once.
fs::path folder_key(const fs::path& dir) {
  std::error_code ec;
  auto canonical = fs::weakly_canonical(dir, ec);
  return ec ? dir.lexically_normal() : canonical;
}

std::string join_paths(const std::vector<fs::path>& paths) {
  std::string text;
  for (const auto& p : paths) text += (text.empty() ? "" : ", ") + p.string();
  return text.empty() ? "(no folders)" : text;
}

// Vets, in parallel child processes, the file the scan will load first for each kind and name
// (the first one with a good name that passes the safety checks), so the scan that follows finds
// their verdicts cached. Files after it are vetted only if the scan gets to them.
void prefetch_vetting(const std::vector<std::pair<fs::path, std::vector<fs::path>>>& listed) {
  std::vector<VetRequest> first;
  std::set<std::pair<int, std::string>> named;
  for (const auto& [dir, candidates] : listed) {
    for (const auto& path : candidates) {
      auto declared = parse_plugin_file_name(path.filename().string(), nullptr);
      if (!declared || named.count({declared->kind, declared->name}) != 0) continue;
      if (unsafe_file_reason(path)) continue;
      named.insert({declared->kind, declared->name});
      first.push_back({path, *declared});
    }
  }
  vet_in_children(first);
}

}  // namespace

std::string Refusal::describe() const {
  return path.string() + ": " + reason;
}

const char* kind_name(ferry_plugin_kind_t kind) noexcept {
  switch (kind) {
    case FERRY_PLUGIN_TRANSPORT:
      return "transport";
    case FERRY_PLUGIN_MODEL:
      return "model";
  }
  return "unknown";
}

std::vector<fs::path> search_path(const std::vector<fs::path>& config_dirs,
                                  const std::optional<std::string>& plugin_path_env, bool elevated,
                                  const fs::path& install_dir,
                                  const std::vector<fs::path>& extra_last) {
  std::vector<fs::path> dirs = config_dirs;
  if (plugin_path_env) {
    if (elevated) {
      logger("registry")
          ->warn(
              "FERRY_PLUGIN_PATH is ignored: the process runs with elevated privileges "
              "(AT_SECURE)");
    } else {
      for (auto& dir : split_path_list(*plugin_path_env)) dirs.push_back(std::move(dir));
    }
  }
  dirs.push_back(install_dir);
  dirs.insert(dirs.end(), extra_last.begin(), extra_last.end());
  return dirs;
}

std::vector<fs::path> plugin_dirs_beside(const fs::path& exe) {
  const fs::path prefix = exe.parent_path().parent_path();
  std::vector<fs::path> dirs{prefix / FERRY_LIBDIR / "ferry" / "plugins"};
  if (fs::path(FERRY_LIBDIR) != "lib") dirs.push_back(prefix / "lib" / "ferry" / "plugins");
  return dirs;
}

std::vector<fs::path> Registry::default_search_path(const std::vector<fs::path>& config_dirs,
                                                    const std::vector<fs::path>& extra_last) {
  std::optional<std::string> env;
  if (const char* value = std::getenv("FERRY_PLUGIN_PATH")) env = value;
  const bool elevated = ::getauxval(AT_SECURE) != 0;
  return search_path(config_dirs, env, elevated, FERRY_PLUGIN_INSTALL_DIR, extra_last);
}

Registry::Registry(std::vector<fs::path> search_dirs) {
  auto log = logger("registry");
  std::set<fs::path> scanned;
  for (auto& dir : search_dirs) {
    if (!scanned.insert(folder_key(dir)).second) continue;
    search_dirs_.push_back(dir);
  }

  std::vector<std::pair<fs::path, std::vector<fs::path>>> listed;  // candidates per folder
  for (const auto& dir : search_dirs_) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      log->debug("plugin folder {} does not exist; skipped", dir.string());
      continue;
    }
    std::vector<fs::path> candidates;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (looks_like_plugin_file(it->path().filename().string())) candidates.push_back(it->path());
    }
    if (ec) {
      log->warn("cannot list plugin folder {}: {}", dir.string(), ec.message());
      continue;
    }
    std::sort(candidates.begin(), candidates.end());
    listed.emplace_back(dir, std::move(candidates));
  }
  prefetch_vetting(listed);

  for (const auto& [dir, candidates] : listed) {
    for (const auto& path : candidates) {
      auto refuse = [&](std::string reason) {
        Refusal refusal{path, std::move(reason)};
        log->warn("refused plugin {}", refusal.describe());
        refused_.push_back(std::move(refusal));
      };
      std::string why;
      auto declared = parse_plugin_file_name(path.filename().string(), &why);
      if (!declared) {
        refuse(why);
        continue;
      }
      if (auto first = find(declared->kind, declared->name)) {
        refuse("shadowed by " + first->info().path.string());
        continue;
      }
      if (auto unsafe = unsafe_file_reason(path)) {
        refuse(*unsafe);
        continue;
      }
      if (auto in_child = vet_in_children({{path, *declared}}).front()) {
        refuse(*in_child);
        continue;
      }
      auto plugin = load_vetted(path, *declared, &why);
      if (!plugin) {
        refuse(why);
        continue;
      }
      const auto& info = plugin->info();
      log->debug("loaded {} plugin '{}' (ABI {}.{}, version '{}') from {}", kind_name(info.kind),
                 info.name, info.abi_major, info.abi_minor, info.version, path.string());
      plugins_.push_back(std::move(plugin));
    }
  }
}

std::shared_ptr<LoadedPlugin> Registry::load_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    fail(FERRY_STATUS_NOT_FOUND, "{}: no such plugin file", path.string());
  }
  std::string why;
  auto declared = parse_plugin_file_name(path.filename().string(), &why);
  if (!declared) fail(FERRY_STATUS_INCOMPATIBLE, "{}: {}", path.string(), why);
  if (auto unsafe = unsafe_file_reason(path)) {
    fail(FERRY_STATUS_INCOMPATIBLE, "{}: {}", path.string(), *unsafe);
  }
  if (auto in_child = vet_in_children({{path, *declared}}).front()) {
    fail(FERRY_STATUS_INCOMPATIBLE, "{}: {}", path.string(), *in_child);
  }
  auto plugin = load_vetted(path, *declared, &why);
  if (!plugin) fail(FERRY_STATUS_INCOMPATIBLE, "{}: {}", path.string(), why);
  return plugin;
}

const std::vector<fs::path>& Registry::search_dirs() const {
  return search_dirs_;
}
const std::vector<std::shared_ptr<LoadedPlugin>>& Registry::plugins() const {
  return plugins_;
}
const std::vector<Refusal>& Registry::refused() const {
  return refused_;
}

std::shared_ptr<LoadedPlugin> Registry::find(ferry_plugin_kind_t kind,
                                             const std::string& name) const {
  for (const auto& plugin : plugins_) {
    if (plugin->info().kind == kind && plugin->info().name == name) return plugin;
  }
  return nullptr;
}

namespace {

[[noreturn]] void fail_not_found(ferry_plugin_kind_t kind, const std::string& name,
                                 const std::vector<fs::path>& dirs,
                                 const std::vector<std::shared_ptr<LoadedPlugin>>& plugins,
                                 const std::vector<Refusal>& refused) {
  std::string available;
  for (const auto& plugin : plugins) {
    if (plugin->info().kind != kind) continue;
    available += (available.empty() ? "" : ", ") + plugin->info().name;
  }
  const std::string file = fmt::format("libferry_{}_{}.so", kind_name(kind), name);
  std::string refusals;
  for (const auto& refusal : refused) {
    if (refusal.path.filename() == file) refusals += "; refused " + refusal.describe();
  }
  fail(FERRY_STATUS_NOT_FOUND, "no {} plugin '{}' ({}) in {}; available: {}{}", kind_name(kind),
       name, file, join_paths(dirs), available.empty() ? "none" : available, refusals);
}

}  // namespace

std::shared_ptr<LoadedPlugin> Registry::transport(const std::string& name) const {
  if (auto plugin = find(FERRY_PLUGIN_TRANSPORT, name)) return plugin;
  fail_not_found(FERRY_PLUGIN_TRANSPORT, name, search_dirs_, plugins_, refused_);
}

std::shared_ptr<LoadedPlugin> Registry::model(const std::string& name) const {
  if (auto plugin = find(FERRY_PLUGIN_MODEL, name)) return plugin;
  fail_not_found(FERRY_PLUGIN_MODEL, name, search_dirs_, plugins_, refused_);
}

}  // namespace ferry::registry
