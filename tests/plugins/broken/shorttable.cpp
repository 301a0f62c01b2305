// tests/plugins/broken/shorttable.cpp: libferry_transport_shorttable.so, whose function table's
// struct_size ends after get_caps (a short struct: create and destroy lie past it).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
const ferry_transport_api_t kShortApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.struct_size = FERRY_STRUCT_SIZE(ferry_transport_api_t, get_caps);
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "shorttable", "0", &kShortApi);
}
