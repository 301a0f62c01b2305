// tests/plugins/broken/negsegv.cpp: libferry_transport_negsegv.so, whose ferry_plugin_negotiate
// dereferences a NULL pointer (SIGSEGV).
#include <ferry/sdk/error.hpp>

namespace {

// A NULL the compiler cannot see through, so it keeps the faulting load.
int* volatile nowhere = nullptr;

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n != nullptr) n->plugin_abi_minor = static_cast<std::uint32_t>(*nowhere);
  return nullptr;
}
