// tests/plugins/broken/overwrite.cpp: libferry_transport_overwrite.so, which writes its answer even
// into a negotiation struct too short to hold it (fails FERRY-ABI-10).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n == nullptr) return nullptr;
  n->plugin_abi_major = FERRY_PLUGIN_ABI_MAJOR;  // ignores struct_size
  n->plugin_abi_minor = FERRY_PLUGIN_ABI_MINOR;
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "overwrite", "0",
                               &ferry::test_plugins::kMockTransportApi);
}
