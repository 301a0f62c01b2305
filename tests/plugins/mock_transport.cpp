// tests/plugins/mock_transport.cpp: an in-memory loopback transport (see mock_transport.hpp)
// over the SDK's transport table (ferry/sdk/transport_plugin.hpp). Buckets are copied into a
// process-wide queue per channel; recv_bucket pops from its own channel, waiting until the
// bucket's deadline.
#include "mock_transport.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct ferry_transport {
  std::vector<std::uint8_t> address();
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer) noexcept;
  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  void deregister_memory(ferry_memory* memory) noexcept;
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);

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

}  // namespace
}  // namespace ferry::test_plugins

using ferry::fail;
using ferry::test_plugins::channels;
using ferry::test_plugins::monotonic_now_ns;
using ferry::test_plugins::range_bytes;

std::vector<std::uint8_t> ferry_transport::address() {
  return {channel.begin(), channel.end()};
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  if (args.num_remote != 1 || args.remote_addresses == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "mock: connect to '{}' needs exactly one remote address, got {}",
         args.peer_name ? args.peer_name : "?", args.num_remote);
  }
  const ferry_blob_t& address = args.remote_addresses[0];
  return new ferry_peer{std::string(reinterpret_cast<const char*>(address.data), address.size)};
}

void ferry_transport::disconnect(ferry_peer* peer) noexcept {
  delete peer;
}

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.kind != FERRY_MEMORY_HOST && desc.kind != FERRY_MEMORY_PINNED) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "mock: memory kind {} is not host memory",
         static_cast<int>(desc.kind));
  }
  if (desc.base == nullptr && desc.size != 0)
    fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: register_memory base is NULL");
  return new ferry_memory{static_cast<std::uint8_t*>(desc.base), desc.size};
}

void ferry_transport::deregister_memory(ferry_memory* memory) noexcept {
  delete memory;
}

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  const std::uint8_t* bytes = range_bytes(bucket.data, "send_bucket data");
  std::vector<std::uint8_t> copy(bytes, bytes + bucket.data.size);
  auto& all = channels();
  {
    std::lock_guard lock(all.mutex);
    all.queues[peer->remote_channel].push_back(std::move(copy));
  }
  all.arrived.notify_all();
  return nullptr;  // complete
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* /*peer*/, const ferry_bucket_io_t& bucket) {
  std::uint8_t* bytes = range_bytes(bucket.data, "recv_bucket data");
  auto& all = channels();
  std::unique_lock lock(all.mutex);
  auto& queue = all.queues[this->channel];
  while (queue.empty()) {
    const std::int64_t left = bucket.deadline_ns - monotonic_now_ns();
    if (bucket.deadline_ns != 0 && left <= 0) {
      fail(FERRY_STATUS_TIMEOUT, "mock: no bucket {} arrived on channel '{}' before the deadline",
           bucket.bucket_index, this->channel);
    }
    if (bucket.deadline_ns == 0) {
      all.arrived.wait(lock);
    } else {
      all.arrived.wait_for(lock, std::chrono::nanoseconds(left));
    }
  }
  std::vector<std::uint8_t> payload = std::move(queue.front());
  queue.pop_front();
  if (payload.size() > bucket.data.size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: bucket {} is {} bytes, the receive range only {}",
         bucket.bucket_index, payload.size(), bucket.data.size);
  }
  std::memcpy(bytes, payload.data(), payload.size());
  return nullptr;
}

namespace ferry::test_plugins {
namespace {

struct MockPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = "mock";
  static constexpr const char* kVersion = "0.1-test";
  static constexpr const char* const* kOptions = nullptr;  // not declared: create checks them
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED, .max_inflight_buckets = 1};
  }

  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    // Without the option each instance gets a channel of its own, so pairs never cross.
    static std::atomic<unsigned> instances{0};
    std::string channel = "mock-" + std::to_string(instances++);
    for (std::size_t i = 0; i < args.num_options; ++i) {
      const ferry_option_t& option = args.options[i];
      const std::string key = option.key ? option.key : "";
      if (key == "channel") {
        channel = option.value ? option.value : "";
        if (channel.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: option 'channel' is empty");
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "mock: unknown option '{}' (known: channel)", key);
      }
    }
    return std::unique_ptr<Transport>(new ferry_transport{channel, args.role});
  }
};

}  // namespace

constinit const ferry_transport_api_t kMockTransportApi = sdk::TransportPlugin<MockPlugin>::kApi;

}  // namespace ferry::test_plugins
