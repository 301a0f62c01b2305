// tests/plugins/broken/anymajor.cpp: libferry_transport_anymajor.so, which accepts a host of any
// ABI major (fails FERRY-ABI-3).
#include <ferry/sdk/error.hpp>

#include "../mock_transport.hpp"

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n == nullptr) return nullptr;
  const std::uint32_t asked = n->host_abi_major;
  n->host_abi_major = FERRY_PLUGIN_ABI_MAJOR;  // pretend the host matches
  ferry_error_t* refused = ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, "anymajor", "0",
                                                 &ferry::test_plugins::kMockTransportApi);
  n->host_abi_major = asked;
  return refused;
}
