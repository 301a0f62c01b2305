// tests/plugins/broken/kindswap.cpp: libferry_model_kindswap.so, a transport in a model's file
// name.
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "kindswap", "0",
                               &ferry::test_plugins::kMockTransportApi);
}
