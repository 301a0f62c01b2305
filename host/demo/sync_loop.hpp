// demo/sync_loop.hpp: `ferry demo`, a complete RL weight-sync loop on a synthetic Qwen3-shaped
// model: the trainer (the calling process) changes its weights every step and delivers them to a
// real receiver (a `ferry serve` child) through the transport demo.transport chooses
// (transport.hpp), lends it memory back (release/resume), and verifies each step by comparing
// the receiver's fingerprints with its own.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "registry/registry.hpp"

namespace ferry::demo {

// What one demo run is given. The references must outlive run().
struct DemoRun {
  const config::Config& config;         // [demo], receiver.token, update.bucket_bytes, memory
  const registry::Registry& registry;   // the trainer's plugins
  std::filesystem::path ferry_exe;      // the `ferry` executable the receiver is started from
  std::vector<std::string> serve_globals;  // placed before "serve": config, plugins, log level
  std::optional<std::filesystem::path> work_dir;  // default: $XDG_CACHE_HOME or ~/.cache,
                                                  // /ferry/demo-<shape>
  bool keep = false;                    // keep every step's checkpoint in the work folder
};

// The receiver's device: cpu, cuda or cuda:N; throws ferry::Error when this build or machine
// cannot use it (called before any checkpoint is written).
void check_device(const std::string& device);

// Runs the loop: prints a line per step and a final table. Returns 0 when every step was
// verified, 1 (with the reason on stderr) at the first failure or mismatch. Throws ferry::Error
// for what fails before the loop starts (no usable transport, a work folder it cannot create).
int run(const DemoRun& request);

}  // namespace ferry::demo
