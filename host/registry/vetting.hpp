// registry/vetting.hpp: loading a plugin first in a child process. A plugin whose constructors or
// negotiation abort, crash or never return would otherwise take the host with it, whether or not
// it is the plugin the config names. The helper executable ferry-plugin-vet (vet_main.cpp) maps
// the file, negotiates and runs the registry's checks, reporting each step on a pipe; the host
// loads the file itself only when the child came through. Verdicts are cached for the process
// per (file, device, inode, size, mtime), so a file is vetted once until it changes.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "registry/plugin_file.hpp"

namespace ferry::registry {

struct VetRequest {
  std::filesystem::path path;
  PluginFileName expected;
};

// What became of the child for each request, in order: nullopt when it loaded, negotiated and
// passed the checks; otherwise the one-line refusal reason ("crashed with SIGSEGV (Segmentation
// fault) in ferry_plugin_negotiate (vetted in a child process)", "did not return within 10 s
// from ferry_plugin_negotiate ...", or the checks' own reason). The children run in parallel.
// Where the helper cannot be found or started, every answer is nullopt (the host then loads in
// process, as before) and a warning says so once.
std::vector<std::optional<std::string>> vet_in_children(const std::vector<VetRequest>& requests);

// How long a child may take: FERRY_PLUGIN_VET_TIMEOUT_S (seconds, > 0), else 10 s.
std::chrono::milliseconds vet_timeout();

// The helper executable, looked for beside the installed tree of the object that holds this code
// (<prefix>/<libexecdir>/ferry/ferry-plugin-vet, <prefix> found from its bindir, libdir or
// libexecdir), then in the build tree (development builds), then at the configured install path
// (common/installed_program.hpp).
std::optional<std::filesystem::path> vet_helper();

// The report protocol between the helper and the host (one line each, on fd kReportFd).
inline constexpr int kReportFd = 3;
inline constexpr const char* kStagePrefix = "stage ";
inline constexpr const char* kRefusedPrefix = "refused ";
inline constexpr const char* kAcceptedLine = "ok";

}  // namespace ferry::registry
