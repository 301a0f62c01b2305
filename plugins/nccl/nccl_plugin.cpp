// nccl/nccl_plugin.cpp: the C entry of libferry_transport_nccl.so: ferry_plugin_negotiate over
// the SDK's transport table (ferry/sdk/transport_plugin.hpp), the NCCL broadcast transport of
// nccl_transport.hpp (README.md, "The transport ABI").
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "nccl/nccl_transport.hpp"

#ifndef FERRY_NCCL_VERSION
#define FERRY_NCCL_VERSION "unknown"
#endif

namespace {

namespace sdk = ferry::sdk;

struct NcclPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "nccl";
  static constexpr const char* kVersion = FERRY_NCCL_VERSION;
  static constexpr const char* const* kOptions = sdk::kNoOptions;  // it takes no options
  static constexpr std::uint32_t kGroups =
      sdk::kBroadcast | sdk::kMemory | sdk::kAsync | sdk::kAbort;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_CUDA,
            .preferred_bucket_bytes = 256ull << 20,
            .max_inflight_buckets = 2};  // double buffering
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    if (args.struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl create: args too short");
    }
    return std::make_unique<Transport>(args);
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return sdk::TransportPlugin<NcclPlugin>::negotiate(negotiation);
}
