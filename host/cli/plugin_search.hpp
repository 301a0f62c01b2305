// cli/plugin_search.hpp: the plugin search path the CLI's subcommands use, and the words the
// CLI prints for capability bits.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/command.hpp"

namespace ferry::cli {

// --plugin-dir folders, then the config's plugin_dirs, then FERRY_PLUGIN_PATH, the install
// directory, ../<libdir>/ferry/plugins and ../lib/ferry/plugins beside the ferry executable
// (globals.ferry_exe, else this one: a staged install, a relocated bundle) and the in-tree build
// folders (registry::Registry::default_search_path).
std::vector<std::filesystem::path> plugin_search_path(const GlobalOptions& globals,
                                                      const std::vector<std::string>& config_dirs);

// "p2p", "broadcast", "same-node", "direct-write", "async", "source" for each set bit.
std::vector<std::string> capability_words(std::uint32_t flags);
// "host", "pinned", "cuda" for each set bit.
std::vector<std::string> memory_kind_words(std::uint32_t kinds);

}  // namespace ferry::cli
