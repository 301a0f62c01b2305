// disk/disk_plugin.cpp: the C entry of libferry_transport_disk.so: negotiation and the
// ferry_transport_api_t table (a CAP_SOURCE transport over disk_source.hpp). Every function is
// wrapped in sdk::guard, so no exception crosses the ABI.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "disk/disk_source.hpp"

#ifndef FERRY_DISK_VERSION
#define FERRY_DISK_VERSION "unknown"
#endif

namespace {
constexpr const char* kName = "disk";
constexpr unsigned kMaxReadThreads = 256;
}  // namespace

// One plugin instance: its options and the abort flag its sources watch.
struct ferry_transport {
  unsigned read_threads = 8;
  std::atomic<bool> aborted{false};
  std::mutex reason_mutex;
  std::string abort_reason;  // guarded by reason_mutex
};

// An open checkpoint. Belongs to the transport that opened it; closed before it is destroyed.
struct ferry_source {
  ferry_transport* transport = nullptr;
  std::string uri;
  std::unique_ptr<ferry::disk::DiskSource> source;
};

namespace {

using ferry::fail;

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Hands `bytes` to the caller as a blob whose release frees them.
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

unsigned parse_read_threads(std::string_view value) {
  unsigned n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 1 || n > kMaxReadThreads) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "disk transport option 'read_threads' = '{}': must be an integer from 1 to {}", value,
         kMaxReadThreads);
  }
  return n;
}

unsigned default_read_threads() {
  return std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
}

ferry_error_t* disk_get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk get_caps: caps is NULL or has no struct_size");
    }
    ferry_transport_caps_t full{};
    full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    full.flags = FERRY_TRANSPORT_CAP_SOURCE;
    full.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED;
    full.preferred_bucket_bytes = 512ull << 20;
    full.max_inflight_buckets = 1;
    // Fill only what both sides know; struct_size then says which fields are present.
    const size_t size = std::min(caps->struct_size, full.struct_size);
    std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
    caps->struct_size = size;
  });
}

ferry_error_t* disk_create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, num_options)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk create: args or out is NULL, or args too short");
    }
    *out = nullptr;
    auto transport = std::make_unique<ferry_transport>();
    transport->read_threads = default_read_threads();
    for (size_t i = 0; i < args->num_options; ++i) {
      const ferry_option_t& option = args->options[i];
      const std::string_view key = option.key ? option.key : "";
      const std::string_view value = option.value ? option.value : "";
      if (key == "read_threads") {
        transport->read_threads = parse_read_threads(value);
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "disk transport: unknown option '{}' (known: read_threads)", key);
      }
    }
    *out = transport.release();
  });
}

void disk_destroy(ferry_transport_t* transport) { delete transport; }

void disk_abort(ferry_transport_t* transport, const char* reason) {
  if (transport == nullptr) return;
  try {
    std::lock_guard lock(transport->reason_mutex);
    transport->abort_reason = reason ? reason : "";
  } catch (...) {
    // Keep the previous reason; the flag below is what stops the readers.
  }
  transport->aborted.store(true);
}

ferry_error_t* disk_source_open(ferry_transport_t* transport, const char* uri,
                                ferry_source_t** out) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || uri == nullptr || out == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk source_open: transport, uri or out is NULL");
    }
    *out = nullptr;
    auto source = std::make_unique<ferry_source>();
    source->transport = transport;
    source->uri = uri;
    source->source = std::make_unique<ferry::disk::DiskSource>(source->uri);
    const auto& ckpt = source->source->checkpoint();
    ferry::sdk::log(FERRY_LOG_INFO, kName,
                    fmt::format("opened {}: {} tensors, {} bytes in {} files", source->uri,
                                ckpt.tensor_count(), ckpt.total_bytes(), ckpt.files.size()));
    *out = source.release();
  });
}

ferry_error_t* disk_source_catalog(ferry_source_t* source, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    if (source == nullptr || out == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk source_catalog: source or out is NULL");
    }
    *out = to_blob(ferry::manifest::encode(source->source->catalog()));
  });
}

ferry_error_t* disk_source_read(ferry_source_t* source, ferry_source_read_args_t* args) {
  return ferry::sdk::guard([&] {
    if (source == nullptr || args == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk source_read: source or args is NULL, or args "
                                          "too short");
    }
    args->manifest = ferry_blob_t{};
    args->bytes_written = 0;
    if (args->dst == nullptr && args->dst_capacity > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "disk source_read: dst is NULL");
    }
    ferry_transport* transport = source->transport;
    const unsigned threads =
        args->num_threads == 0 ? transport->read_threads
                               : std::min<unsigned>(args->num_threads, kMaxReadThreads);
    const std::int64_t deadline = args->deadline_ns;
    const std::string& uri = source->uri;
    auto interrupt = [transport, deadline, &uri] {
      if (transport->aborted.load()) {
        std::lock_guard lock(transport->reason_mutex);
        fail(FERRY_STATUS_ABORTED, "{}: read aborted: {}", uri, transport->abort_reason);
      }
      // A deadline of 0 (or less) means none.
      if (deadline > 0 && monotonic_ns() > deadline) {
        fail(FERRY_STATUS_TIMEOUT, "{}: reading a bucket passed its deadline", uri);
      }
    };
    interrupt();
    auto bucket = source->source->read(
        {static_cast<std::uint8_t*>(args->dst), static_cast<size_t>(args->dst_capacity)},
        threads, interrupt);
    if (!bucket) {
      fail(FERRY_STATUS_END_OF_STREAM, "{}: no more buckets", uri);
    }
    std::vector<std::uint8_t> bytes = ferry::manifest::encode(bucket->manifest);
    args->manifest = to_blob(std::move(bytes));
    args->bytes_written = bucket->bytes_written;
  });
}

void disk_source_close(ferry_source_t* source) { delete source; }

const ferry_transport_api_t kApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    disk_get_caps,
    disk_create,
    disk_destroy,
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
    disk_abort,
    disk_source_open,
    disk_source_catalog,
    disk_source_read,
    disk_source_close,
    nullptr,  // put_many
};

}  // namespace

// The option keys create accepts ([transport.disk]; plugin ABI 1.3).
constexpr const char* kOptionKeys[] = {"read_threads", nullptr};

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, kName, FERRY_DISK_VERSION,
                               &kApi, kOptionKeys);
}
