// cuda_ipc/cuda_ipc_plugin.cpp: the C entry of libferry_transport_cuda_ipc.so:
// ferry_plugin_negotiate over the SDK's transport table (ferry/sdk/transport_plugin.hpp), a
// same-node point-to-point transport with deferred, fingerprinting direct writes over
// cuda_ipc_transport.hpp.
#include <dlfcn.h>
#include <ferry/plugin.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "cuda_ipc_transport.hpp"

#ifndef FERRY_CUDA_IPC_VERSION
#define FERRY_CUDA_IPC_VERSION "unknown"
#endif

namespace {

namespace sdk = ferry::sdk;

struct CudaIpcPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "cuda_ipc";
  static constexpr const char* kVersion = FERRY_CUDA_IPC_VERSION;
  // The option keys create accepts ([transport.cuda_ipc]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {"socket_dir", "copy_lanes", nullptr};
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory | sdk::kDirectWrite |
                                           sdk::kPutFingerprint | sdk::kPutChunkHashes |
                                           sdk::kDeferredPuts | sdk::kPreparePuts |
                                           sdk::kMapPeerMemory | sdk::kAsync | sdk::kAbort;
  // A process cannot open the CUDA IPC handles it exported itself.
  static constexpr std::uint32_t kConstraints =
      FERRY_TRANSPORT_CAP_SAME_NODE_ONLY | FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_CUDA | FERRY_MEMORY_PINNED,
            .preferred_bucket_bytes = 512ull << 20,
            .max_inflight_buckets = 8};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    return std::make_unique<Transport>(
        args, ferry::cuda_ipc::parse_options(args.options, args.num_options));
  }
};

// This library holds a CUDA kernel (batch_copy.cu), which the CUDA runtime registers when the
// library loads and refers to afterwards; unloading it (a host that drops its plugin registry and
// loads the plugin again) would leave the runtime with dangling references. The library pins
// itself in memory the first time it is negotiated: dlclose then leaves it mapped.
void pin_this_library() noexcept {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&pin_this_library), &info) != 0 &&
      info.dli_fname != nullptr) {
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  static const bool pinned = (pin_this_library(), true);
  (void)pinned;
  return sdk::TransportPlugin<CudaIpcPlugin>::negotiate(negotiation);
}
