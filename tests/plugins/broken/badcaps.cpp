// tests/plugins/broken/badcaps.cpp: libferry_transport_badcaps.so, which declares DIRECT_WRITE
// without put, flush or pack_key (fails FERRY-ABI-7).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
ferry_error_t* get_caps_claiming_direct_write(ferry_transport_caps_t* caps) {
  ferry_error_t* error = ferry::test_plugins::kMockTransportApi.get_caps(caps);
  if (error == nullptr) caps->flags |= FERRY_TRANSPORT_CAP_DIRECT_WRITE;
  return error;
}

const ferry_transport_api_t kApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.get_caps = get_caps_claiming_direct_write;
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "badcaps", "0", &kApi);
}
