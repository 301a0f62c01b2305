// ucx/ucx_plugin.cpp: the C entry of libferry_transport_ucx.so: negotiation and the
// ferry_transport_api_t table over ucx_transport.hpp. Every function is wrapped in sdk::guard,
// so no exception crosses the ABI.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "ucx_transport.hpp"

#ifndef FERRY_UCX_VERSION
#define FERRY_UCX_VERSION "unknown"
#endif

namespace {

using ferry::fail;

constexpr const char* kName = "ucx";

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

// Rejects a NULL or too-short struct argument.
template <typename T>
void require(const T* p, std::size_t min_size, const char* what) {
  if (p == nullptr || p->struct_size < min_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx: {} is NULL or its struct_size is too small", what);
  }
}

void require_transport(const ferry_transport_t* t, const char* call) {
  if (t == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx {}: transport is NULL", call);
}

template <typename T>
void require_out(T** out, const char* call) {
  if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx {}: out is NULL", call);
  *out = nullptr;
}

ferry_error_t* ucx_get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx get_caps: caps is NULL or has no struct_size");
    }
    ferry_transport_caps_t full{};
    full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    full.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_DIRECT_WRITE |
                 FERRY_TRANSPORT_CAP_ASYNC;
    full.memory_kinds = ferry::ucx::supported_memory_kinds();
    full.preferred_bucket_bytes = 256ull << 20;
    full.max_inflight_buckets = 4;
    const size_t size = std::min(caps->struct_size, full.struct_size);
    std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
    caps->struct_size = size;
  });
}

ferry_error_t* ucx_create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    require(args, FERRY_STRUCT_SIZE(ferry_transport_create_args_t, num_options), "create args");
    require_out(out, "create");
    if (args->num_options > 0 && args->options == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx create: num_options > 0 but options is NULL");
    }
    auto options = ferry::ucx::parse_options(args->options, args->num_options);
    *out = new ferry_transport(*args, std::move(options));
  });
}

void ucx_destroy(ferry_transport_t* transport) { delete transport; }

ferry_error_t* ucx_get_address(ferry_transport_t* transport, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "get_address");
    if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx get_address: out is NULL");
    *out = to_blob(transport->address());
  });
}

ferry_error_t* ucx_connect(ferry_transport_t* transport, const ferry_connect_args_t* args,
                           ferry_peer_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "connect");
    require(args, FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns), "connect args");
    require_out(out, "connect");
    *out = transport->connect(*args);
  });
}

void ucx_disconnect(ferry_transport_t* transport, ferry_peer_t* peer) {
  if (transport != nullptr) transport->disconnect(peer);
}

ferry_error_t* ucx_register_memory(ferry_transport_t* transport, const ferry_memory_desc_t* desc,
                                   ferry_memory_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "register_memory");
    require(desc, FERRY_STRUCT_SIZE(ferry_memory_desc_t, kind), "memory desc");
    require_out(out, "register_memory");
    ferry_memory_desc_t copy{};
    std::memcpy(&copy, desc, std::min(desc->struct_size, sizeof copy));
    *out = transport->register_memory(copy);
  });
}

ferry_error_t* ucx_pack_key(ferry_transport_t* transport, ferry_memory_t* memory,
                            ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "pack_key");
    if (out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx pack_key: out is NULL");
    *out = to_blob(transport->pack_key(memory));
  });
}

void ucx_deregister_memory(ferry_transport_t* transport, ferry_memory_t* memory) {
  if (transport != nullptr) transport->deregister_memory(memory);
}

ferry_error_t* ucx_send_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                               const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "send_bucket");
    require(bucket, FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns), "bucket");
    require_out(out, "send_bucket");
    *out = transport->send_bucket(peer, *bucket);
  });
}

ferry_error_t* ucx_recv_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                               const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "recv_bucket");
    require(bucket, FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns), "bucket");
    require_out(out, "recv_bucket");
    *out = transport->recv_bucket(peer, *bucket);
  });
}

ferry_error_t* ucx_put(ferry_transport_t* transport, ferry_peer_t* peer,
                       const ferry_put_args_t* args, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "put");
    require(args, FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns), "put args");
    require_out(out, "put");
    *out = transport->put(peer, *args);
  });
}

ferry_error_t* ucx_flush(ferry_transport_t* transport, ferry_peer_t* peer, std::int64_t deadline_ns,
                         ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "flush");
    require_out(out, "flush");
    *out = transport->flush(peer, deadline_ns);
  });
}

ferry_error_t* ucx_request_test(ferry_transport_t* transport, ferry_request_t* request, int* done) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "request_test");
    if (done == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx request_test: done is NULL");
    *done = 0;
    *done = transport->test(request) ? 1 : 0;
  });
}

ferry_error_t* ucx_request_wait(ferry_transport_t* transport, ferry_request_t* request,
                                std::int64_t deadline_ns) {
  return ferry::sdk::guard([&] {
    require_transport(transport, "request_wait");
    transport->wait(request, deadline_ns);
  });
}

void ucx_request_free(ferry_transport_t* transport, ferry_request_t* request) {
  if (transport != nullptr) transport->free_request(request);
}

void ucx_abort(ferry_transport_t* transport, const char* reason) {
  if (transport != nullptr) transport->abort(reason != nullptr ? reason : "no reason given");
}

const ferry_transport_api_t kApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    ucx_get_caps,
    ucx_create,
    ucx_destroy,
    ucx_get_address,
    ucx_connect,
    ucx_disconnect,
    ucx_register_memory,
    ucx_pack_key,
    ucx_deregister_memory,
    ucx_send_bucket,
    ucx_recv_bucket,
    ucx_put,
    ucx_flush,
    ucx_request_test,
    ucx_request_wait,
    ucx_request_free,
    ucx_abort,
    nullptr,  // source_open
    nullptr,  // source_catalog
    nullptr,  // source_read
    nullptr,  // source_close
    nullptr,  // put_many
};

}  // namespace

// The option keys create accepts ([transport.ucx]; plugin ABI 1.3).
constexpr const char* kOptionKeys[] = {"tls", "error_mode", "rma", "keepalive_interval", "spin_polls", nullptr};

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, kName, FERRY_UCX_VERSION,
                               &kApi, kOptionKeys);
}
