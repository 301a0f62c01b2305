// tests/plugins/broken/lenient.cpp: libferry_transport_lenient.so, whose create ignores unknown
// options (fails FERRY-ABI-6).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

namespace {
ferry_error_t* create_ignoring_options(const ferry_transport_create_args_t* args,
                                       ferry_transport_t** out) {
  ferry_transport_create_args_t without = *args;
  without.options = nullptr;
  without.num_options = 0;
  return ferry::test_plugins::kMockTransportApi.create(&without, out);
}

const ferry_transport_api_t kApi = [] {
  ferry_transport_api_t api = ferry::test_plugins::kMockTransportApi;
  api.create = create_ignoring_options;
  return api;
}();
}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "lenient", "0", &kApi);
}
