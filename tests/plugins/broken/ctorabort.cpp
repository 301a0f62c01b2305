// tests/plugins/broken/ctorabort.cpp: libferry_transport_ctorabort.so, whose constructor aborts as
// the library is mapped, before any ferry code of it runs (a plugin that cannot find its
// hardware and calls abort()).
#include <ferry/sdk/error.hpp>

#include <cstdio>
#include <cstdlib>

namespace {

__attribute__((constructor)) void abort_on_load() {
  std::fprintf(stderr, "ctorabort: no device found, giving up (test plugin)\n");
  std::abort();
}

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* /*n*/) {
  return nullptr;
}
