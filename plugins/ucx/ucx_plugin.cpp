// ucx/ucx_plugin.cpp: the C entry of libferry_transport_ucx.so: ferry_plugin_negotiate over the
// SDK's transport table (ferry/sdk/transport_plugin.hpp), a point-to-point transport with direct
// writes, memory it allocates itself and asynchronous requests over ucx_transport.hpp.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "ucx_transport.hpp"

#ifndef FERRY_UCX_VERSION
#define FERRY_UCX_VERSION "unknown"
#endif

namespace {

namespace sdk = ferry::sdk;

struct UcxPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "ucx";
  static constexpr const char* kVersion = FERRY_UCX_VERSION;
  // The option keys create accepts ([transport.ucx]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {
      "tls", "error_mode", "rma", "keepalive_interval", "spin_polls", nullptr};
  static constexpr std::uint32_t kGroups =
      sdk::kPointToPoint | sdk::kMemory | sdk::kAllocMemory | sdk::kDirectWrite | sdk::kAsync |
      sdk::kAbort;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = ferry::ucx::supported_memory_kinds(),
            .preferred_bucket_bytes = 256ull << 20,
            .max_inflight_buckets = 4};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    return std::make_unique<Transport>(args,
                                       ferry::ucx::parse_options(args.options, args.num_options));
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return sdk::TransportPlugin<UcxPlugin>::negotiate(negotiation);
}
