// tests/plugins/mock_transport.cpp: an in-memory loopback transport (see mock_transport.hpp).
// Buckets are copied into a process-wide queue per channel; recv_bucket pops from its own
// channel, waiting until the bucket's deadline.
#include "mock_transport.hpp"

#include <ferry/sdk/error.hpp>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct ferry_transport {
  std::string channel;
  ferry_role_t role;
};

struct ferry_peer {
  std::string remote_channel;
};

struct ferry_memory {
  std::uint8_t* base;
  std::uint64_t size;
};

namespace ferry::test_plugins {
namespace {

constexpr const char* kName = "mock";

struct Channels {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::string, std::deque<std::vector<std::uint8_t>>> queues;
};

Channels& channels() {
  static auto* all = new Channels();  // never destroyed: may be used until the process exits
  return *all;
}

std::int64_t monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The bytes `range` names, after checking it lies inside its registration.
std::uint8_t* range_bytes(const ferry_memory_range_t& range, const char* what) {
  if (range.memory == nullptr)
    fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: {} has no registration", what);
  const auto* memory = range.memory;
  if (range.offset > memory->size || range.size > memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: {} [{}, +{}) lies outside its {}-byte registration",
         what, range.offset, range.size, memory->size);
  }
  return memory->base + range.offset;
}

ferry_error_t* get_caps(ferry_transport_caps_t* caps) {
  return sdk::guard([&] {
    if (caps == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: get_caps caps is NULL");
    ferry_transport_caps_t full{};
    full.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT;
    full.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED;
    full.preferred_bucket_bytes = 0;
    full.max_inflight_buckets = 1;
    // Only the fields the caller's struct has.
    const std::size_t size = std::min(caps->struct_size, sizeof full);
    if (size > sizeof(std::size_t)) {
      std::memcpy(reinterpret_cast<char*>(caps) + sizeof(std::size_t),
                  reinterpret_cast<const char*>(&full) + sizeof(std::size_t),
                  size - sizeof(std::size_t));
    }
  });
}

ferry_error_t* create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return sdk::guard([&] {
    if (args == nullptr || out == nullptr)
      fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: create args or out is NULL");
    // Without the option each instance gets a channel of its own, so pairs never cross.
    static std::atomic<unsigned> instances{0};
    std::string channel = "mock-" + std::to_string(instances++);
    for (std::size_t i = 0; i < args->num_options; ++i) {
      const ferry_option_t& option = args->options[i];
      const std::string key = option.key ? option.key : "";
      if (key == "channel") {
        channel = option.value ? option.value : "";
        if (channel.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: option 'channel' is empty");
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: unknown option '{}' (known: channel)", key);
      }
    }
    *out = new ferry_transport{channel, args->role};
  });
}

void destroy(ferry_transport_t* transport) {
  delete transport;
}

void release_string(const std::uint8_t* /*data*/, void* ctx) {
  delete static_cast<std::string*>(ctx);
}

ferry_error_t* get_address(ferry_transport_t* transport, ferry_blob_t* out) {
  return sdk::guard([&] {
    auto* copy = new std::string(transport->channel);
    out->struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    out->data = reinterpret_cast<const std::uint8_t*>(copy->data());
    out->size = copy->size();
    out->release = release_string;
    out->release_ctx = copy;
  });
}

ferry_error_t* connect(ferry_transport_t* /*transport*/, const ferry_connect_args_t* args,
                       ferry_peer_t** out) {
  return sdk::guard([&] {
    if (args->num_remote != 1 || args->remote_addresses == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "mock: connect to '{}' needs exactly one remote address, got {}",
           args->peer_name ? args->peer_name : "?", args->num_remote);
    }
    const ferry_blob_t& address = args->remote_addresses[0];
    *out = new ferry_peer{std::string(reinterpret_cast<const char*>(address.data), address.size)};
  });
}

void disconnect(ferry_transport_t* /*transport*/, ferry_peer_t* peer) {
  delete peer;
}

ferry_error_t* register_memory(ferry_transport_t* /*transport*/, const ferry_memory_desc_t* desc,
                               ferry_memory_t** out) {
  return sdk::guard([&] {
    if (desc->kind != FERRY_MEMORY_HOST && desc->kind != FERRY_MEMORY_PINNED) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "mock: memory kind {} is not host memory",
           static_cast<int>(desc->kind));
    }
    if (desc->base == nullptr && desc->size != 0)
      fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: register_memory base is NULL");
    *out = new ferry_memory{static_cast<std::uint8_t*>(desc->base), desc->size};
  });
}

void deregister_memory(ferry_transport_t* /*transport*/, ferry_memory_t* memory) {
  delete memory;
}

ferry_error_t* send_bucket(ferry_transport_t* /*transport*/, ferry_peer_t* peer,
                           const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return sdk::guard([&] {
    const std::uint8_t* bytes = range_bytes(bucket->data, "send_bucket data");
    std::vector<std::uint8_t> copy(bytes, bytes + bucket->data.size);
    auto& all = channels();
    {
      std::lock_guard lock(all.mutex);
      all.queues[peer->remote_channel].push_back(std::move(copy));
    }
    all.arrived.notify_all();
    if (out != nullptr) *out = nullptr;  // complete
  });
}

ferry_error_t* recv_bucket(ferry_transport_t* transport, ferry_peer_t* /*peer*/,
                           const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return sdk::guard([&] {
    std::uint8_t* bytes = range_bytes(bucket->data, "recv_bucket data");
    auto& all = channels();
    std::unique_lock lock(all.mutex);
    auto& queue = all.queues[transport->channel];
    while (queue.empty()) {
      const std::int64_t left = bucket->deadline_ns - monotonic_now_ns();
      if (bucket->deadline_ns != 0 && left <= 0) {
        fail(FERRY_STATUS_TIMEOUT, "mock: no bucket {} arrived on channel '{}' before the deadline",
             bucket->bucket_index, transport->channel);
      }
      if (bucket->deadline_ns == 0) {
        all.arrived.wait(lock);
      } else {
        all.arrived.wait_for(lock, std::chrono::nanoseconds(left));
      }
    }
    std::vector<std::uint8_t> payload = std::move(queue.front());
    queue.pop_front();
    if (payload.size() > bucket->data.size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: bucket {} is {} bytes, the receive range only {}",
           bucket->bucket_index, payload.size(), bucket->data.size);
    }
    std::memcpy(bytes, payload.data(), payload.size());
    if (out != nullptr) *out = nullptr;
  });
}

}  // namespace

const ferry_transport_api_t kMockTransportApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    get_caps,
    create,
    destroy,
    get_address,
    connect,
    disconnect,
    register_memory,
    nullptr,  // pack_key: no direct write
    deregister_memory,
    send_bucket,
    recv_bucket,
    nullptr,  // put
    nullptr,  // flush
    nullptr,  // request_test: synchronous
    nullptr,  // request_wait
    nullptr,  // request_free
    nullptr,  // abort
    nullptr,  // source_open: not a source
    nullptr,  // source_catalog
    nullptr,  // source_read
    nullptr,  // source_close
    nullptr,  // put_many
};

}  // namespace ferry::test_plugins
