// tests/plugins/broken/nullfn.cpp: libferry_transport_nullfn.so, whose required function destroy is
// NULL.
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
const ferry_transport_api_t kApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.destroy = nullptr;
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "nullfn", "0", &kApi);
}
