// cli/cmd_version.cpp: `ferry version`: the ferry version, the plugin ABI it implements and the
// optional features compiled in.
#include <cstdio>

#include "cli/command.hpp"
#include "ferry_build_config.h"
#include "registry/registry.hpp"

namespace ferry::cli {

Action add_version_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  app.add_subcommand("version", "print the ferry version, plugin ABI and compiled-in features");
  return [] {
    auto yes_no = [](int on) { return on ? "yes" : "no"; };
    std::printf("ferry %s\n", FERRY_VERSION);
    std::printf("plugin ABI %d.%d (accepts plugins of ABI %d.%u and later minors)\n",
                FERRY_PLUGIN_ABI_MAJOR, FERRY_PLUGIN_ABI_MINOR, FERRY_PLUGIN_ABI_MAJOR,
                registry::kMinPluginAbiMinor);
    std::printf("features: cuda %s, nccl %s, ucx %s, zmq %s\n", yes_no(FERRY_HAVE_CUDA),
                yes_no(FERRY_HAVE_NCCL), yes_no(FERRY_HAVE_UCX), yes_no(FERRY_HAVE_ZMQ));
    std::printf("plugin install dir: %s\n", FERRY_PLUGIN_INSTALL_DIR);
    return 0;
  };
}

}  // namespace ferry::cli
