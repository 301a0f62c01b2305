// ckpt_engine/ckpt_engine_plugin.cpp: the C entry of libferry_transport_ckpt_engine.so:
// ferry_plugin_negotiate over the SDK's transport table (ferry/sdk/transport_plugin.hpp). The
// worker side of one checkpoint-engine update is a source (CAP_SOURCE, same node only):
// source_open connects to the ParameterServer's ZMQ address, source_catalog receives and opens
// the CUDA IPC buffer, source_read yields one bucket at a time, source_close gives the final
// answer (ckpt_engine_transport.hpp, README.md).
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>

#include "ckpt_engine/ckpt_engine_transport.hpp"

#ifndef FERRY_CKPT_ENGINE_VERSION
#define FERRY_CKPT_ENGINE_VERSION "unknown"
#endif

namespace {

struct CkptEnginePlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "ckpt_engine";
  static constexpr const char* kVersion = FERRY_CKPT_ENGINE_VERSION;
  // The option keys create accepts ([transport.ckpt_engine]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {"receive_timeout_s", "abort_grace_s",
                                             "release_before_finish", nullptr};
  static constexpr std::uint32_t kGroups = ferry::sdk::kSource | ferry::sdk::kAbort;
  static constexpr std::uint32_t kConstraints = FERRY_TRANSPORT_CAP_SAME_NODE_ONLY;

  static ferry::sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED | FERRY_MEMORY_CUDA,
            .preferred_bucket_bytes = 0,  // the ParameterServer chooses
            .max_inflight_buckets = 1};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    if (args.struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "ckpt_engine create: args too short");
    }
    return std::make_unique<Transport>(args);
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::TransportPlugin<CkptEnginePlugin>::negotiate(negotiation);
}
