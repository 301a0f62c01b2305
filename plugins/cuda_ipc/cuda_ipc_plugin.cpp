// cuda_ipc/cuda_ipc_plugin.cpp: the C entry of libferry_transport_cuda_ipc.so: negotiation and
// the ferry_transport_api_t table over cuda_ipc_transport.hpp. Every function is wrapped in
// sdk::guard, so no exception crosses the ABI.
#include <dlfcn.h>
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda_ipc_transport.hpp"

#ifndef FERRY_CUDA_IPC_VERSION
#define FERRY_CUDA_IPC_VERSION "unknown"
#endif

namespace {

using ferry::fail;

ferry_blob_t to_blob(std::vector<std::uint8_t> bytes) {
  auto* owned = new std::vector<std::uint8_t>(std::move(bytes));
  ferry_blob_t blob{};
  blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  blob.data = owned->data();
  blob.size = owned->size();
  blob.release = [](const std::uint8_t*, void* ctx) {
    delete static_cast<std::vector<std::uint8_t>*>(ctx);
  };
  blob.release_ctx = owned;
  return blob;
}

// Copies a caller's struct into a zeroed full-size one (fields past its struct_size stay 0).
template <typename T>
T read_struct(const T* p, std::size_t min_size, const char* what) {
  if (p == nullptr || p->struct_size < min_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc: {} is NULL or its struct_size is too small",
         what);
  }
  T copy{};
  std::memcpy(&copy, p, std::min(p->struct_size, sizeof copy));
  return copy;
}

void require_transport(const ferry_transport_t* t, const char* call) {
  if (t == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc {}: transport is NULL", call);
}

template <typename T>
void require_out(T** out, const char* call) {
  if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc {}: out is NULL", call);
  *out = nullptr;
}

ferry_error_t* cuda_ipc_get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc get_caps: caps is NULL or has no struct_size");
    }
    ferry_transport_caps_t full{};
    full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    full.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY |
                 FERRY_TRANSPORT_CAP_DIRECT_WRITE | FERRY_TRANSPORT_CAP_ASYNC |
                 FERRY_TRANSPORT_CAP_PUT_FINGERPRINT | FERRY_TRANSPORT_CAP_PUT_DEFERRED |
                 FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES;
    full.memory_kinds = FERRY_MEMORY_CUDA | FERRY_MEMORY_PINNED;
    full.preferred_bucket_bytes = 512ull << 20;
    full.max_inflight_buckets = 8;
    const size_t size = std::min(caps->struct_size, full.struct_size);
    std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
    caps->struct_size = size;
  });
}

ferry_error_t* cuda_ipc_create(const ferry_transport_create_args_t* args,
                               ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    auto a = read_struct(args, FERRY_STRUCT_SIZE(ferry_transport_create_args_t, num_options),
                         "create args");
    require_out(out, "create");
    if (a.struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) a.device = -1;
    if (a.num_options > 0 && a.options == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc create: num_options > 0 but options is NULL");
    }
    auto options = ferry::cuda_ipc::parse_options(a.options, a.num_options);
    *out = new ferry_transport(a, std::move(options));
  });
}

void cuda_ipc_destroy(ferry_transport_t* transport) { delete transport; }

ferry_error_t* cuda_ipc_get_address(ferry_transport_t* transport, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "get_address");
    if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc get_address: out is NULL");
    *out = to_blob(transport->address());
  });
}

ferry_error_t* cuda_ipc_connect(ferry_transport_t* transport, const ferry_connect_args_t* args,
                                ferry_peer_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "connect");
    const auto a =
        read_struct(args, FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns), "connect args");
    require_out(out, "connect");
    *out = transport->connect(a);
  });
}

void cuda_ipc_disconnect(ferry_transport_t* transport, ferry_peer_t* peer) {
  if (transport != nullptr) transport->disconnect(peer);
}

ferry_error_t* cuda_ipc_register_memory(ferry_transport_t* transport,
                                        const ferry_memory_desc_t* desc, ferry_memory_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "register_memory");
    const auto d = read_struct(desc, FERRY_STRUCT_SIZE(ferry_memory_desc_t, kind), "memory desc");
    require_out(out, "register_memory");
    *out = transport->register_memory(d);
  });
}

ferry_error_t* cuda_ipc_pack_key(ferry_transport_t* transport, ferry_memory_t* memory,
                                 ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "pack_key");
    if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc pack_key: out is NULL");
    *out = to_blob(transport->pack_key(memory));
  });
}

void cuda_ipc_deregister_memory(ferry_transport_t* transport, ferry_memory_t* memory) {
  if (transport != nullptr) transport->deregister_memory(memory);
}

ferry_error_t* cuda_ipc_send_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                                    const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "send_bucket");
    const auto b = read_struct(bucket, FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns), "bucket");
    require_out(out, "send_bucket");
    *out = transport->send_bucket(peer, b);
  });
}

ferry_error_t* cuda_ipc_recv_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                                    const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "recv_bucket");
    const auto b = read_struct(bucket, FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns), "bucket");
    require_out(out, "recv_bucket");
    *out = transport->recv_bucket(peer, b);
  });
}

ferry_error_t* cuda_ipc_put(ferry_transport_t* transport, ferry_peer_t* peer,
                            const ferry_put_args_t* args, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "put");
    const auto a = read_struct(args, FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns), "put args");
    require_out(out, "put");
    *out = transport->put(peer, a);
  });
}

ferry_error_t* cuda_ipc_put_many(ferry_transport_t* transport, ferry_peer_t* peer,
                                 const ferry_put_args_t* const* args, size_t count) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "put_many");
    if (args == nullptr && count > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc put_many: args is NULL");
    }
    std::vector<ferry_put_args_t> puts;
    puts.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      puts.push_back(
          read_struct(args[i], FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns), "put args"));
    }
    transport->put_many(peer, puts);
  });
}

ferry_error_t* cuda_ipc_flush(ferry_transport_t* transport, ferry_peer_t* peer,
                              int64_t /*deadline_ns*/, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "flush");
    require_out(out, "flush");
    *out = transport->flush(peer);
  });
}

ferry_error_t* cuda_ipc_request_test(ferry_transport_t* transport, ferry_request_t* request,
                                     int* done) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "request_test");
    if (request == nullptr || done == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc request_test: request or done is NULL");
    }
    *done = 0;
    *done = transport->progress(request, 0) ? 1 : 0;
  });
}

ferry_error_t* cuda_ipc_request_wait(ferry_transport_t* transport, ferry_request_t* request,
                                     int64_t deadline_ns) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "request_wait");
    if (request == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc request_wait: request is NULL");
    }
    const std::int64_t deadline =
        deadline_ns > 0 ? deadline_ns : ferry::cuda_ipc::monotonic_ns() + 300'000'000'000;
    if (!transport->progress(request, deadline)) {
      const std::string peer = request->peer != nullptr ? request->peer->link->name() : "a peer";
      fail(FERRY_STATUS_TIMEOUT, "cuda_ipc: deadline passed waiting for a request to {}", peer);
    }
  });
}

void cuda_ipc_request_free(ferry_transport_t* transport, ferry_request_t* request) {
  if (transport != nullptr) transport->request_free(request);
}

void cuda_ipc_abort(ferry_transport_t* transport, const char* reason) {
  if (transport != nullptr) transport->abort(reason);
}

const ferry_transport_api_t kApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, put_many),
    cuda_ipc_get_caps,
    cuda_ipc_create,
    cuda_ipc_destroy,
    cuda_ipc_get_address,
    cuda_ipc_connect,
    cuda_ipc_disconnect,
    cuda_ipc_register_memory,
    cuda_ipc_pack_key,
    cuda_ipc_deregister_memory,
    cuda_ipc_send_bucket,
    cuda_ipc_recv_bucket,
    cuda_ipc_put,
    cuda_ipc_flush,
    cuda_ipc_request_test,
    cuda_ipc_request_wait,
    cuda_ipc_request_free,
    cuda_ipc_abort,
    nullptr,  // source_open
    nullptr,  // source_catalog
    nullptr,  // source_read
    nullptr,  // source_close
    cuda_ipc_put_many,
};

}  // namespace

// This library holds a CUDA kernel (batch_copy.cu), which the CUDA runtime registers when the
// library loads and refers to afterwards; unloading it (a host that drops its plugin registry and
// loads the plugin again) would leave the runtime with dangling references. The library pins
// itself in memory the first time it is negotiated: dlclose then leaves it mapped.
static void pin_this_library() noexcept {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&pin_this_library), &info) != 0 &&
      info.dli_fname != nullptr) {
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

// The option keys create accepts ([transport.cuda_ipc]; plugin ABI 1.3).
constexpr const char* kOptionKeys[] = {"socket_dir", "copy_lanes", nullptr};

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  static const bool pinned = (pin_this_library(), true);
  (void)pinned;
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, "cuda_ipc",
                               FERRY_CUDA_IPC_VERSION, &kApi, kOptionKeys);
}
