// tests/plugins/broken/silent.cpp: libferry_transport_silent.so, which accepts the host but fills
// in no answer (as a plugin built for a layout it does not know would).
#include <ferry/sdk/error.hpp>

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n != nullptr && n->struct_size >= FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, host)) {
    ferry::sdk::set_host_api(n->host);
  }
  return nullptr;
}
