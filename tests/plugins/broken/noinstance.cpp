// tests/plugins/broken/noinstance.cpp: libferry_transport_noinstance.so, whose create without
// options reports success but returns no instance (fails FERRY-ABI-11).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
ferry_error_t* create_nothing(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  if (args->num_options != 0) return ferry::test_plugins::kMockTransportApi.create(args, out);
  *out = nullptr;
  return nullptr;
}

const ferry_transport_api_t kApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.create = create_nothing;
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "noinstance", "0", &kApi);
}
