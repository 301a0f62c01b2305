// ckpt_engine/ckpt_engine_plugin.cpp: the C entry of libferry_transport_ckpt_engine.so:
// negotiation and the ferry_transport_api_t table. The worker side of one checkpoint-engine
// update is a source (CAP_SOURCE): source_open connects to the ParameterServer's ZMQ address,
// source_catalog receives and opens the CUDA IPC buffer, source_read yields one bucket at a time,
// source_close gives the final answer (README.md). Every function is wrapped in sdk::guard.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt_engine/cuda_buffer.hpp"
#include "ckpt_engine/zmq_worker.hpp"

#ifndef FERRY_CKPT_ENGINE_VERSION
#define FERRY_CKPT_ENGINE_VERSION "unknown"
#endif

namespace {
constexpr const char* kName = "ckpt_engine";
}  // namespace

// One plugin instance: its options and the sources open on it (so abort() reaches them).
struct ferry_transport {
  int device = 0;
  ferry::ckpt_engine::ZmqWorkerOptions options;
  std::mutex mutex;
  std::set<ferry_source*> sources;  // guarded by mutex
  std::string abort_reason;         // guarded by mutex; set once abort() was called
};

// One update: the worker on its REP socket. Closed before its transport is destroyed.
struct ferry_source {
  ferry_transport* transport = nullptr;
  std::unique_ptr<ferry::ckpt_engine::ZmqWorker> worker;
};

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

double parse_seconds(std::string_view key, std::string_view value) {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !(v > 0) || v > 86400) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ckpt_engine transport option '{}' = '{}': must be seconds in (0, 86400]", key, value);
  }
  return v;
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

ferry_error_t* ce_get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ckpt_engine get_caps: caps is NULL or has no struct_size");
    }
    ferry_transport_caps_t full{};
    full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    full.flags = FERRY_TRANSPORT_CAP_SOURCE | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY;
    full.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED | FERRY_MEMORY_CUDA;
    full.preferred_bucket_bytes = 0;  // the ParameterServer chooses
    full.max_inflight_buckets = 1;
    const size_t size = std::min(caps->struct_size, full.struct_size);
    std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
    caps->struct_size = size;
  });
}

ferry_error_t* ce_create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ckpt_engine create: args or out is NULL, or args too short");
    }
    *out = nullptr;
    if (args->role != FERRY_ROLE_RECEIVER) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "ckpt_engine: only the receiver (worker) side exists; the sender is checkpoint-engine's "
           "own ParameterServer");
    }
    auto transport = std::make_unique<ferry_transport>();
    transport->device = args->device < 0 ? 0 : args->device;
    for (size_t i = 0; i < args->num_options; ++i) {
      const std::string_view key = args->options[i].key ? args->options[i].key : "";
      const std::string_view value = args->options[i].value ? args->options[i].value : "";
      if (key == "receive_timeout_s") {
        transport->options.receive_timeout = to_ms(parse_seconds(key, value));
      } else if (key == "abort_grace_s") {
        transport->options.abort_grace = to_ms(parse_seconds(key, value));
      } else if (key == "release_before_finish") {
        if (value != "true" && value != "false") {
          fail(FERRY_STATUS_INVALID_ARGUMENT,
               "ckpt_engine transport option 'release_before_finish' = '{}': must be true or false",
               value);
        }
        transport->options.session.release_before_finish = value == "true";
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "ckpt_engine transport: unknown option '{}' (known: receive_timeout_s, "
             "abort_grace_s, release_before_finish)",
             key);
      }
    }
    *out = transport.release();
  });
}

void ce_destroy(ferry_transport_t* transport) { delete transport; }

void ce_abort(ferry_transport_t* transport, const char* reason) {
  if (transport == nullptr) return;
  try {
    std::lock_guard lock(transport->mutex);
    transport->abort_reason = reason != nullptr && *reason ? reason : "aborted by the host";
    for (auto* source : transport->sources) source->worker->abandon(transport->abort_reason);
  } catch (...) {
    // abort() must not throw; an allocation failure leaves the worker's deadline to end it.
  }
}

ferry_error_t* ce_source_open(ferry_transport_t* transport, const char* uri, ferry_source_t** out) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || uri == nullptr || out == nullptr || *uri == '\0') {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ckpt_engine source_open: needs the ParameterServer's ZMQ address as the URI");
    }
    *out = nullptr;
    auto source = std::make_unique<ferry_source>();
    source->transport = transport;
    source->worker = std::make_unique<ferry::ckpt_engine::ZmqWorker>(
        uri, ferry::ckpt_engine::make_cuda_ipc_opener(transport->device), transport->options);
    std::lock_guard lock(transport->mutex);
    if (!transport->abort_reason.empty()) source->worker->abandon(transport->abort_reason);
    transport->sources.insert(source.get());
    *out = source.release();
  });
}

// The checkpoint-engine protocol names no tensors in advance: the "catalog" is empty, and its
// bucket_bytes is the largest bucket the sender can send (half its double buffer), so the host
// can size its staging. Receiving it receives and opens the IPC handle (the first message).
ferry_error_t* ce_source_catalog(ferry_source_t* source, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    if (source == nullptr || out == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ckpt_engine source_catalog: NULL argument");
    }
    ferry::manifest::Manifest catalog;
    catalog.bucket_bytes = source->worker->open_buffer(0);
    *out = to_blob(ferry::manifest::encode(catalog));
  });
}

ferry_error_t* ce_source_read(ferry_source_t* source, ferry_source_read_args_t* args) {
  return ferry::sdk::guard([&] {
    if (source == nullptr || args == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ckpt_engine source_read: NULL or short args");
    }
    args->bytes_written = 0;
    auto bucket = source->worker->next_bucket(args->dst, args->dst_capacity, args->deadline_ns);
    if (!bucket) {
      fail(FERRY_STATUS_END_OF_STREAM, "checkpoint-engine update at {}: the sender finished",
           source->worker->address());
    }
    args->manifest = to_blob(std::move(bucket->manifest));
    args->bytes_written = bucket->bytes;
  });
}

// Answers the sender's last message: empty (success) when the host did not call abort(), the
// abort reason otherwise (also when the update did not reach the sender's final None).
void ce_source_close(ferry_source_t* source) {
  if (source == nullptr) return;
  {
    std::lock_guard lock(source->transport->mutex);
    source->transport->sources.erase(source);
  }
  try {
    source->worker->conclude();
  } catch (...) {
    // The sender is gone; nothing is owed to anyone.
  }
  delete source;
}

const ferry_transport_api_t kApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    ce_get_caps,
    ce_create,
    ce_destroy,
    nullptr,  // get_address
    nullptr,  // connect
    nullptr,  // disconnect
    nullptr,  // register_memory
    nullptr,  // pack_key
    nullptr,  // deregister_memory
    nullptr,  // send_bucket
    nullptr,  // recv_bucket
    nullptr,  // put
    nullptr,  // flush
    nullptr,  // request_test
    nullptr,  // request_wait
    nullptr,  // request_free
    ce_abort,
    ce_source_open,
    ce_source_catalog,
    ce_source_read,
    ce_source_close,
    nullptr,  // put_many
};

}  // namespace

// The option keys create accepts ([transport.ckpt_engine]; plugin ABI 1.3).
constexpr const char* kOptionKeys[] = {"receive_timeout_s", "abort_grace_s", "release_before_finish", nullptr};

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, kName,
                               FERRY_CKPT_ENGINE_VERSION, &kApi, kOptionKeys);
}
