// tests/plugins/broken/refuses.cpp: libferry_transport_refuses.so, which refuses every host with
// INCOMPATIBLE.
#include <ferry/sdk/error.hpp>

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n == nullptr || n->struct_size < FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, host))
    return nullptr;
  ferry::sdk::set_host_api(n->host);
  return ferry::sdk::make_error(FERRY_STATUS_INCOMPATIBLE,
                                "refuses: needs host ABI 1.7 or newer (test plugin)");
}
