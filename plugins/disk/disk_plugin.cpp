// disk/disk_plugin.cpp: the C entry of libferry_transport_disk.so: ferry_plugin_negotiate over
// the SDK's transport table (ferry/sdk/transport_plugin.hpp), a CAP_SOURCE transport over
// disk_transport.hpp.
#include <ferry/plugin.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "disk/disk_transport.hpp"

#ifndef FERRY_DISK_VERSION
#define FERRY_DISK_VERSION "unknown"
#endif

namespace {

struct DiskPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "disk";
  static constexpr const char* kVersion = FERRY_DISK_VERSION;
  // The option keys create accepts ([transport.disk]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {"read_threads", nullptr};
  static constexpr std::uint32_t kGroups = ferry::sdk::kSource | ferry::sdk::kAbort;

  static ferry::sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED,
            .preferred_bucket_bytes = 512ull << 20,
            .max_inflight_buckets = 1};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    return std::make_unique<Transport>(args);
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::TransportPlugin<DiskPlugin>::negotiate(negotiation);
}
