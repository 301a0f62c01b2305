// tests/plugins/loop_transport.cpp: libferry_transport_loop.so, a small point-to-point transport
// with direct writes, as a vendor would write one, over the SDK's transport table
// (ferry/sdk/transport_plugin.hpp): instances find each other through a process-wide table of
// live instances (the address is an instance id), put copies into the peer's registered memory at
// once (the remote key carries its base and size), flush then has nothing left to wait for, and
// send_bucket hands a copy to the peer's inbox, from which recv_bucket takes it before its
// deadline.
//
// Built a second time for each deliberately broken variant in tests/plugins/broken/, selected by
// FERRY_LOOP_BREAK (the variant's name is FERRY_LOOP_NAME):
//   1 putoverrun: put writes 256 bytes past the range it was given;
//   2 stuckflush: flush never returns;
//   3 racycreate: create and destroy change the table of instances without its lock.
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/transport_plugin.hpp>

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#ifndef FERRY_LOOP_BREAK
#define FERRY_LOOP_BREAK 0
#endif
#ifndef FERRY_LOOP_NAME
#define FERRY_LOOP_NAME "loop"
#endif

struct ferry_transport {
  ferry_transport();
  ~ferry_transport();

  std::vector<std::uint8_t> address() const;
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer) noexcept;
  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  void deregister_memory(ferry_memory* memory) noexcept;
  std::vector<std::uint8_t> pack_key(ferry_memory* memory);
  ferry_request* put(ferry_peer* peer, const ferry_put_args_t& args);
  ferry_request* flush(ferry_peer* peer, std::int64_t deadline_ns);
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);

  std::uint64_t id = 0;
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::vector<std::uint8_t>> inbox;
};

struct ferry_peer {
  std::uint64_t remote = 0;
};

struct ferry_memory {
  std::uint8_t* base;
  std::uint64_t size;
};

namespace {

using ferry::fail;

constexpr const char* kName = FERRY_LOOP_NAME;

// The remote key: where the peer's registration is (the pair lives in one process).
struct Key {
  std::uint64_t base;
  std::uint64_t size;
};

struct Instances {
  std::mutex mutex;
  std::uint64_t next = 0;
  std::map<std::uint64_t, ferry_transport*> live;
};

// An object, not a heap pointer: the host unloads the plugin after its last instance is
// destroyed, and the table goes with it (a leaked table would be lost at every unload).
Instances& instances() {
  static Instances all;
  return all;
}

std::int64_t monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::uint8_t* range_bytes(const ferry_memory_range_t& range, const char* what) {
  if (range.memory == nullptr)
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} has no registration", kName, what);
  if (range.offset > range.memory->size || range.size > range.memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} [{}, +{}) lies outside its {}-byte registration",
         kName, what, range.offset, range.size, range.memory->size);
  }
  return range.memory->base + range.offset;
}

std::vector<std::uint8_t> bytes_of(const void* data, std::size_t size) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  return {p, p + size};
}

}  // namespace

ferry_transport::ferry_transport() {
  auto& all = instances();
#if FERRY_LOOP_BREAK != 3
  std::lock_guard lock(all.mutex);
#endif
  id = ++all.next;
  all.live[id] = this;
}

ferry_transport::~ferry_transport() {
  auto& all = instances();
#if FERRY_LOOP_BREAK != 3
  std::lock_guard lock(all.mutex);
#endif
  all.live.erase(id);
}

std::vector<std::uint8_t> ferry_transport::address() const {
  return bytes_of(&id, sizeof id);
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  std::uint64_t remote = 0;
  if (args.num_remote != 1 || args.remote_addresses[0].size != sizeof remote) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: connect needs one {}-byte address", kName,
         sizeof remote);
  }
  std::memcpy(&remote, args.remote_addresses[0].data, sizeof remote);
  return new ferry_peer{remote};
}

void ferry_transport::disconnect(ferry_peer* peer) noexcept {
  delete peer;
}

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.kind != FERRY_MEMORY_HOST && desc.kind != FERRY_MEMORY_PINNED) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "{}: only host memory", kName);
  }
  return new ferry_memory{static_cast<std::uint8_t*>(desc.base), desc.size};
}

void ferry_transport::deregister_memory(ferry_memory* memory) noexcept {
  delete memory;
}

std::vector<std::uint8_t> ferry_transport::pack_key(ferry_memory* memory) {
  const Key key{reinterpret_cast<std::uint64_t>(memory->base), memory->size};
  return bytes_of(&key, sizeof key);
}

ferry_request* ferry_transport::put(ferry_peer* /*peer*/, const ferry_put_args_t& args) {
  const std::uint8_t* from = range_bytes(args.local, "put source");
  Key key{};
  if (args.remote_key == nullptr || args.remote_key->size != sizeof key) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: put needs a {}-byte remote key", kName, sizeof key);
  }
  std::memcpy(&key, args.remote_key->data, sizeof key);
  const std::uint64_t n = args.local.size;
  if (args.remote_offset > key.size || n > key.size - args.remote_offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: put of {} bytes at {} outside the {}-byte remote range", kName, n, args.remote_offset,
         key.size);
  }
  auto* to = reinterpret_cast<std::uint8_t*>(key.base) + args.remote_offset;
#if FERRY_LOOP_BREAK == 1
  std::memmove(to, from, n + 256);  // the vendor's bug: a header's worth too many
#else
  std::memmove(to, from, n);
#endif
  return nullptr;  // complete
}

ferry_request* ferry_transport::flush(ferry_peer* /*peer*/, std::int64_t /*deadline_ns*/) {
#if FERRY_LOOP_BREAK == 2
  for (;;) ::pause();  // waits for an acknowledgement nobody sends
#endif
  return nullptr;  // every put completed when it returned
}

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  const std::uint8_t* bytes = range_bytes(bucket.data, "send_bucket data");
  auto& all = instances();
  std::lock_guard lock(all.mutex);
  auto it = all.live.find(peer->remote);
  if (it == all.live.end()) {
    fail(FERRY_STATUS_PEER_FAILED, "{}: peer {} is gone", kName, peer->remote);
  }
  {
    std::lock_guard inbox_lock(it->second->mutex);
    it->second->inbox.emplace_back(bytes, bytes + bucket.data.size);
  }
  it->second->arrived.notify_all();
  return nullptr;
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* /*peer*/, const ferry_bucket_io_t& bucket) {
  std::uint8_t* bytes = range_bytes(bucket.data, "recv_bucket data");
  std::unique_lock lock(mutex);
  while (inbox.empty()) {
    const std::int64_t left = bucket.deadline_ns - monotonic_now_ns();
    if (left <= 0) {
      fail(FERRY_STATUS_TIMEOUT, "{}: no bucket {} arrived before the deadline", kName,
           bucket.bucket_index);
    }
    arrived.wait_for(lock, std::chrono::nanoseconds(left));
  }
  std::vector<std::uint8_t> payload = std::move(inbox.front());
  inbox.pop_front();
  if (payload.size() > bucket.data.size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: bucket of {} bytes, receive range of {}", kName,
         payload.size(), bucket.data.size);
  }
  std::memcpy(bytes, payload.data(), payload.size());
  return nullptr;
}

namespace {

namespace sdk = ferry::sdk;

struct LoopPlugin {
  using Transport = ferry_transport;
  static constexpr const char* kName = FERRY_LOOP_NAME;
  static constexpr const char* kVersion = "0.1-test";
  static constexpr const char* const* kOptions = nullptr;  // not declared: create checks them
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory | sdk::kDirectWrite;

  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED, .max_inflight_buckets = 1};
  }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    if (args.num_options > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: unknown option '{}' (it has none)", kName,
           args.options[0].key ? args.options[0].key : "");
    }
    return std::make_unique<Transport>();
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return sdk::TransportPlugin<LoopPlugin>::negotiate(n);
}
