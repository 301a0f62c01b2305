// tests/plugins/broken/alpha.cpp: libferry_transport_alpha.so, which reports the name 'beta'.
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "beta", "0",
                               &ferry::test_plugins::kMockTransportApi);
}
