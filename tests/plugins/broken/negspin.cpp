// tests/plugins/broken/negspin.cpp: libferry_model_negspin.so, whose ferry_plugin_negotiate never
// returns (it waits for a service that never answers). A model plugin: vetting covers every kind.
#include <ferry/sdk/error.hpp>

#include <unistd.h>

#include <atomic>

namespace {

std::atomic<bool> answered{false};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* /*n*/) {
  while (!answered.load()) ::usleep(1000);
  return nullptr;
}
