// tests/common/plugin_loader.hpp: loads a built plugin for a test program the way the host does:
// dlopen of the file an environment variable names (meson sets it to the build's .so), then
// ferry_plugin_negotiate with the host's services table, checking the kind, name and ABI major it
// answers. Include as "tests/common/plugin_loader.hpp" (the source root is on the include path of
// everything that uses ferry_common_dep).
#pragma once

#include <dlfcn.h>
#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/host_api.hpp"

namespace ferry::test {

// The negotiated answer of the plugin whose path is in $env_var, or NULL after a gtest failure
// that says why (variable unset, dlopen or dlsym error, negotiation refused). A plugin of another
// kind, name or ABI major is a test failure too, but its answer is still returned. Loaded once
// per variable for the whole program and never dlclosed, so the tables stay valid; a failed load
// is not retried. Thread-safe; call it first in the parent before forking children.
inline const ferry_plugin_negotiation_t* load_plugin(const char* env_var, ferry_plugin_kind_t kind,
                                                     const char* name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ferry_plugin_negotiation_t>> loaded;
  const std::lock_guard lock(mutex);
  if (auto it = loaded.find(env_var); it != loaded.end()) return it->second.get();
  std::unique_ptr<ferry_plugin_negotiation_t>& slot = loaded[env_var];
  const char* path = std::getenv(env_var);
  if (path == nullptr) {
    ADD_FAILURE() << "set " << env_var << " to the built plugin (libferry_*_" << name << ".so)";
    return nullptr;
  }
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    ADD_FAILURE() << dlerror();
    return nullptr;
  }
  auto negotiate =
      reinterpret_cast<ferry_plugin_negotiate_fn>(dlsym(handle, FERRY_PLUGIN_ENTRY_SYMBOL));
  if (negotiate == nullptr) {
    ADD_FAILURE() << path << " exports no " << FERRY_PLUGIN_ENTRY_SYMBOL;
    return nullptr;
  }
  auto n = std::make_unique<ferry_plugin_negotiation_t>();
  n->struct_size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, api);
  n->host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
  n->host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
  n->host = host_api_table();
  ErrorPtr error(negotiate(n.get()));
  if (error) {
    ADD_FAILURE() << path << ": " << error_message(error.get());
    return nullptr;
  }
  EXPECT_EQ(n->kind, kind) << path;
  EXPECT_STREQ(n->name, name) << path;
  EXPECT_EQ(n->plugin_abi_major, static_cast<std::uint32_t>(FERRY_PLUGIN_ABI_MAJOR)) << path;
  slot = std::move(n);
  return slot.get();
}

// The transport table of the plugin in $env_var (see load_plugin), or NULL.
inline const ferry_transport_api_t* load_transport_plugin(const char* env_var, const char* name) {
  const ferry_plugin_negotiation_t* n = load_plugin(env_var, FERRY_PLUGIN_TRANSPORT, name);
  return n == nullptr ? nullptr : static_cast<const ferry_transport_api_t*>(n->api);
}

// The model table of the plugin in $env_var (see load_plugin), or NULL.
inline const ferry_model_api_t* load_model_plugin(const char* env_var, const char* name) {
  const ferry_plugin_negotiation_t* n = load_plugin(env_var, FERRY_PLUGIN_MODEL, name);
  return n == nullptr ? nullptr : static_cast<const ferry_model_api_t*>(n->api);
}

}  // namespace ferry::test
