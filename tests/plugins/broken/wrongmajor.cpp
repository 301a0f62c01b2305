// tests/plugins/broken/wrongmajor.cpp: libferry_transport_wrongmajor.so, the mock transport
// reporting plugin ABI major 2.
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  ferry_error_t* refused = ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "wrongmajor", "0",
                                                 &ferry::test_plugins::kMockTransportApi);
  if (refused == nullptr) n->plugin_abi_major = FERRY_PLUGIN_ABI_MAJOR + 1;
  return refused;
}
