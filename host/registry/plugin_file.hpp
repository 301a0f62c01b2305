// registry/plugin_file.hpp: what a plugin's file says before it is loaded: the kind and name its
// file name declares, and whether the file and its folder are safe to load code from.
#pragma once

#include <ferry/plugin.h>

#include <filesystem>
#include <optional>
#include <string>

namespace ferry::registry {

// What "libferry_<kind>_<name>.so" declares.
struct PluginFileName {
  ferry_plugin_kind_t kind = FERRY_PLUGIN_TRANSPORT;
  std::string name;
};

// Whether `filename` (no folder) claims to be a plugin at all: starts with libferry_transport_ or
// libferry_model_ and ends with .so. Other files in a search folder are ignored, not refused.
bool looks_like_plugin_file(const std::string& filename);

// Parses a file name that looks like a plugin. nullopt with `*why` set when the name part is
// empty or has characters outside [a-z0-9_-].
std::optional<PluginFileName> parse_plugin_file_name(const std::string& filename, std::string* why);

// Checks the file and the folder that holds it (after following symlinks, and the folder it was
// found in): each must be a regular file / folder, not world-writable, and owned by root or by
// the effective user. Returns the one-line reason to refuse, or nullopt when safe.
std::optional<std::string> unsafe_file_reason(const std::filesystem::path& path);

}  // namespace ferry::registry
