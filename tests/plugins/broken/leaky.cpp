// tests/plugins/broken/leaky.cpp: libferry_transport_leaky.so, a working transport that also
// exports ferry_leaky_debug_counter (its own version script): the host accepts it, conformance
// fails FERRY-ABI-9.
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT int ferry_leaky_debug_counter() {
  return 42;
}

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "leaky", "0",
                               &ferry::test_plugins::kMockTransportApi);
}
