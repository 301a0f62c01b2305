// tests/plugins/mock_transport_entry.cpp: entry of libferry_transport_mock.so.
#include <ferry/sdk/error.hpp>

#include "mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "mock", "0.1-test",
                               &ferry::test_plugins::kMockTransportApi);
}
