// cli/plugin_search.cpp: where the CLI looks for plugins (see plugin_search.hpp), including the
// in-tree build folders baked in at configure time.
#include "cli/plugin_search.hpp"

#include <algorithm>

#include "ferry_in_tree_plugins.h"
#include "registry/registry.hpp"

namespace ferry::cli {

std::vector<std::string> in_tree_plugin_dirs() {
  const std::string joined = FERRY_IN_TREE_PLUGIN_DIRS;
  std::vector<std::string> dirs;
  std::size_t start = 0;
  while (start <= joined.size()) {
    const auto end = std::min(joined.find(':', start), joined.size());
    if (end > start) dirs.push_back(joined.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

std::vector<std::filesystem::path> plugin_search_path(const GlobalOptions& globals,
                                                      const std::vector<std::string>& config_dirs) {
  std::vector<std::filesystem::path> first(globals.plugin_dirs.begin(), globals.plugin_dirs.end());
  first.insert(first.end(), config_dirs.begin(), config_dirs.end());
  std::vector<std::filesystem::path> last;
  // A relocated or staged install (scripts/bundle, meson install --destdir): plugins in
  // ../<libdir>/ferry/plugins or ../lib/ferry/plugins beside the executable.
  std::error_code ec;
  const auto exe = globals.ferry_exe.empty() ? std::filesystem::read_symlink("/proc/self/exe", ec)
                                             : globals.ferry_exe;
  if (!ec) {
    for (auto& dir : registry::plugin_dirs_beside(exe)) last.push_back(std::move(dir));
  }
  for (const auto& d : in_tree_plugin_dirs()) last.emplace_back(d);
  return registry::Registry::default_search_path(first, last);
}

std::vector<std::string> capability_words(std::uint32_t flags) {
  static const std::pair<std::uint32_t, const char*> kWords[] = {
      {FERRY_TRANSPORT_CAP_POINT_TO_POINT, "p2p"},
      {FERRY_TRANSPORT_CAP_BROADCAST, "broadcast"},
      {FERRY_TRANSPORT_CAP_SAME_NODE_ONLY, "same-node"},
      {FERRY_TRANSPORT_CAP_DIRECT_WRITE, "direct-write"},
      {FERRY_TRANSPORT_CAP_ASYNC, "async"},
      {FERRY_TRANSPORT_CAP_SOURCE, "source"},
      {FERRY_TRANSPORT_CAP_PUT_FINGERPRINT, "put-fingerprint"},
      {FERRY_TRANSPORT_CAP_PUT_DEFERRED, "put-deferred"},
      {FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES, "put-chunk-hashes"},
      {FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES, "separate-processes"},
      {FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS, "group-rendezvous"},
  };
  std::vector<std::string> words;
  for (const auto& [bit, word] : kWords) {
    if ((flags & bit) != 0) words.emplace_back(word);
  }
  return words;
}

std::vector<std::string> memory_kind_words(std::uint32_t kinds) {
  static const std::pair<std::uint32_t, const char*> kWords[] = {
      {FERRY_MEMORY_HOST, "host"}, {FERRY_MEMORY_PINNED, "pinned"}, {FERRY_MEMORY_CUDA, "cuda"}};
  std::vector<std::string> words;
  for (const auto& [bit, word] : kWords) {
    if ((kinds & bit) != 0) words.emplace_back(word);
  }
  return words;
}

}  // namespace ferry::cli
