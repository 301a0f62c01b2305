// tests/plugins/broken/noentry.cpp: libferry_transport_noentry.so, which exports ferry_plugin_entry
// instead of the entry symbol (its own version script).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_entry(ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "noentry", "0",
                               &ferry::test_plugins::kMockTransportApi);
}
