// torch_gloo/torch_gloo_plugin.cpp: the C entry of libferry_transport_torch_gloo.so:
// ferry_plugin_negotiate over the SDK's transport table (ferry/sdk/transport_plugin.hpp), the
// torch.distributed gloo broadcast transport of torch_gloo_transport.hpp (README.md). This file
// and the transport link no libtorch: the backend that does is loaded at the first connect.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "torch_gloo/torch_gloo_transport.hpp"

#ifndef FERRY_TORCH_GLOO_VERSION
#define FERRY_TORCH_GLOO_VERSION "unknown"
#endif

namespace {

namespace sdk = ferry::sdk;

constexpr const char* kOptionKeys[] = {"interface", "store_prefixes", nullptr};

struct TorchGlooPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "torch_gloo";
  static constexpr const char* kVersion = FERRY_TORCH_GLOO_VERSION;
  static constexpr const char* const* kOptions = kOptionKeys;
  static constexpr std::uint32_t kGroups =
      sdk::kBroadcast | sdk::kMemory | sdk::kAsync | sdk::kAbort;
  static constexpr std::uint32_t kConstraints = FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED,
            .preferred_bucket_bytes = 256ull << 20,
            .max_inflight_buckets = 2};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    return std::make_unique<Transport>(args);
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return sdk::TransportPlugin<TorchGlooPlugin>::negotiate(negotiation);
}
