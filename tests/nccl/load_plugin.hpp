// tests/nccl/load_plugin.hpp: loads libferry_transport_nccl.so (path in FERRY_NCCL_PLUGIN) with
// dlopen and negotiates it with the host's services table, once per test program.
#pragma once

#include <dlfcn.h>
#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/host_api.hpp"

namespace ferry::nccl::test {

// The plugin's table, or NULL (with a test failure) when it cannot be loaded.
inline const ferry_transport_api_t* load_nccl_plugin() {
  static const ferry_transport_api_t* api = []() -> const ferry_transport_api_t* {
    const char* path = std::getenv("FERRY_NCCL_PLUGIN");
    if (path == nullptr) {
      ADD_FAILURE() << "set FERRY_NCCL_PLUGIN to libferry_transport_nccl.so";
      return nullptr;
    }
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      ADD_FAILURE() << dlerror();
      return nullptr;
    }
    auto negotiate =
        reinterpret_cast<ferry_plugin_negotiate_fn>(dlsym(handle, FERRY_PLUGIN_ENTRY_SYMBOL));
    if (negotiate == nullptr) return nullptr;
    static ferry_plugin_negotiation_t n{};
    n.struct_size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, api);
    n.host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
    n.host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
    n.host = host_api_table();
    ErrorPtr error(negotiate(&n));
    if (error) {
      ADD_FAILURE() << error_message(error.get());
      return nullptr;
    }
    EXPECT_EQ(n.kind, FERRY_PLUGIN_TRANSPORT);
    EXPECT_STREQ(n.name, "nccl");
    return static_cast<const ferry_transport_api_t*>(n.api);
  }();
  return api;
}

}  // namespace ferry::nccl::test
