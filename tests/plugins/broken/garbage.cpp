// tests/plugins/broken/garbage.cpp: libferry_transport_garbage.so, whose answer points at unmapped
// memory (name, version, api).
#include <ferry/sdk/error.hpp>

#include <cstdint>

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  ferry_error_t* refused =
      ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "garbage", "0", nullptr);
  if (refused != nullptr) return refused;
  // Addresses in the never-mapped first page.
  n->name = reinterpret_cast<const char*>(std::uintptr_t{16});
  n->version = reinterpret_cast<const char*>(std::uintptr_t{24});
  n->api = reinterpret_cast<const void*>(std::uintptr_t{32});
  return nullptr;
}
