// tests/plugins/broken/negsegv.cpp: libferry_transport_negsegv.so, whose ferry_plugin_negotiate
// dereferences a NULL pointer (SIGSEGV).
#include <ferry/sdk/error.hpp>

namespace {

// A NULL the compiler cannot see through, so it keeps the faulting load.
int* volatile nowhere = nullptr;

}  // namespace

// Not instrumented: under the sanitizers (scripts/sanitize) the load must still fault, not be
// reported as undefined behaviour first.
extern "C" FERRY_PLUGIN_EXPORT __attribute__((no_sanitize("undefined"))) ferry_error_t*
ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  if (n != nullptr) n->plugin_abi_minor = static_cast<std::uint32_t>(*nowhere);
  return nullptr;
}
