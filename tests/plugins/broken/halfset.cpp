// tests/plugins/broken/halfset.cpp: libferry_transport_halfset.so, which registers memory but has
// no deregister_memory (fails FERRY-ABI-8).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
const ferry_transport_api_t kApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.deregister_memory = nullptr;
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "halfset", "0", &kApi);
}
