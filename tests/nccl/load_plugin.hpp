// tests/nccl/load_plugin.hpp: the NCCL transport plugin (path in FERRY_NCCL_PLUGIN), loaded and
// negotiated once per test program by the shared test loader.
#pragma once

#include "tests/common/plugin_loader.hpp"

namespace ferry::nccl::test {

// The plugin's table, or NULL (with a test failure) when it cannot be loaded.
inline const ferry_transport_api_t* load_nccl_plugin() {
  return ferry::test::load_transport_plugin("FERRY_NCCL_PLUGIN", "nccl");
}

}  // namespace ferry::nccl::test
