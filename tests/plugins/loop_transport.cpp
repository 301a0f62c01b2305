// tests/plugins/loop_transport.cpp: libferry_transport_loop.so, a small point-to-point transport
// with direct writes, as a vendor would write one: instances find each other through a
// process-wide table of live instances (the address is an instance id), put copies into the
// peer's registered memory at once (the remote key carries its base and size), flush then has
// nothing left to wait for, and send_bucket hands a copy to the peer's inbox, from which
// recv_bucket takes it before its deadline.
//
// Built a second time for each deliberately broken variant in tests/plugins/broken/, selected by
// FERRY_LOOP_BREAK (the variant's name is FERRY_LOOP_NAME):
//   1 putoverrun: put writes 256 bytes past the range it was given;
//   2 stuckflush: flush never returns;
//   3 racycreate: create and destroy change the table of instances without its lock.
#include <ferry/sdk/error.hpp>

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
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

Instances& instances() {
  static auto* all = new Instances();  // never destroyed: used until the process exits
  return *all;
}

std::int64_t monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::uint8_t* range_bytes(const ferry_memory_range_t& range, const char* what) {
  if (range.memory == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} has no registration", kName, what);
  if (range.offset > range.memory->size || range.size > range.memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} [{}, +{}) lies outside its {}-byte registration",
         kName, what, range.offset, range.size, range.memory->size);
  }
  return range.memory->base + range.offset;
}

void release_bytes(const std::uint8_t* /*data*/, void* ctx) {
  delete static_cast<std::vector<std::uint8_t>*>(ctx);
}

void give_blob(const void* data, std::size_t size, ferry_blob_t* out) {
  auto* copy = new std::vector<std::uint8_t>(static_cast<const std::uint8_t*>(data),
                                             static_cast<const std::uint8_t*>(data) + size);
  out->struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  out->data = copy->data();
  out->size = copy->size();
  out->release = release_bytes;
  out->release_ctx = copy;
}

ferry_error_t* get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    ferry_transport_caps_t full{};
    full.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_DIRECT_WRITE;
    full.memory_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED;
    full.max_inflight_buckets = 1;
    const std::size_t size = std::min(caps->struct_size, sizeof full);
    if (size > sizeof(std::size_t)) {
      std::memcpy(reinterpret_cast<char*>(caps) + sizeof(std::size_t),
                  reinterpret_cast<const char*>(&full) + sizeof(std::size_t),
                  size - sizeof(std::size_t));
    }
  });
}

ferry_error_t* create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    if (args->num_options > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: unknown option '{}' (it has none)", kName,
           args->options[0].key ? args->options[0].key : "");
    }
    auto* t = new ferry_transport();
    auto& all = instances();
#if FERRY_LOOP_BREAK != 3
    std::lock_guard lock(all.mutex);
#endif
    t->id = ++all.next;
    all.live[t->id] = t;
    *out = t;
  });
}

void destroy(ferry_transport_t* t) {
  auto& all = instances();
  {
#if FERRY_LOOP_BREAK != 3
    std::lock_guard lock(all.mutex);
#endif
    all.live.erase(t->id);
  }
  delete t;
}

ferry_error_t* get_address(ferry_transport_t* t, ferry_blob_t* out) {
  return ferry::sdk::guard([&] { give_blob(&t->id, sizeof t->id, out); });
}

ferry_error_t* connect(ferry_transport_t* /*t*/, const ferry_connect_args_t* args,
                       ferry_peer_t** out) {
  return ferry::sdk::guard([&] {
    std::uint64_t id = 0;
    if (args->num_remote != 1 || args->remote_addresses[0].size != sizeof id) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: connect needs one {}-byte address", kName,
           sizeof id);
    }
    std::memcpy(&id, args->remote_addresses[0].data, sizeof id);
    *out = new ferry_peer{id};
  });
}

void disconnect(ferry_transport_t* /*t*/, ferry_peer_t* peer) {
  delete peer;
}

ferry_error_t* register_memory(ferry_transport_t* /*t*/, const ferry_memory_desc_t* desc,
                               ferry_memory_t** out) {
  return ferry::sdk::guard([&] {
    if (desc->kind != FERRY_MEMORY_HOST && desc->kind != FERRY_MEMORY_PINNED) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "{}: only host memory", kName);
    }
    *out = new ferry_memory{static_cast<std::uint8_t*>(desc->base), desc->size};
  });
}

void deregister_memory(ferry_transport_t* /*t*/, ferry_memory_t* memory) {
  delete memory;
}

ferry_error_t* pack_key(ferry_transport_t* /*t*/, ferry_memory_t* memory, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    const Key key{reinterpret_cast<std::uint64_t>(memory->base), memory->size};
    give_blob(&key, sizeof key, out);
  });
}

ferry_error_t* put(ferry_transport_t* /*t*/, ferry_peer_t* /*peer*/, const ferry_put_args_t* args,
                   ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    const std::uint8_t* from = range_bytes(args->local, "put source");
    Key key{};
    if (args->remote_key == nullptr || args->remote_key->size != sizeof key) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: put needs a {}-byte remote key", kName, sizeof key);
    }
    std::memcpy(&key, args->remote_key->data, sizeof key);
    const std::uint64_t n = args->local.size;
    if (args->remote_offset > key.size || n > key.size - args->remote_offset) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: put of {} bytes at {} outside the {}-byte remote range",
           kName, n, args->remote_offset, key.size);
    }
    auto* to = reinterpret_cast<std::uint8_t*>(key.base) + args->remote_offset;
#if FERRY_LOOP_BREAK == 1
    std::memmove(to, from, n + 256);  // the vendor's bug: a header's worth too many
#else
    std::memmove(to, from, n);
#endif
    *out = nullptr;  // complete
  });
}

ferry_error_t* flush(ferry_transport_t* /*t*/, ferry_peer_t* /*peer*/, std::int64_t /*deadline*/,
                     ferry_request_t** out) {
#if FERRY_LOOP_BREAK == 2
  for (;;) ::pause();  // waits for an acknowledgement nobody sends
#endif
  *out = nullptr;  // every put completed when it returned
  return nullptr;
}

ferry_error_t* send_bucket(ferry_transport_t* /*t*/, ferry_peer_t* peer,
                           const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    const std::uint8_t* bytes = range_bytes(bucket->data, "send_bucket data");
    auto& all = instances();
    std::lock_guard lock(all.mutex);
    auto it = all.live.find(peer->remote);
    if (it == all.live.end()) {
      fail(FERRY_STATUS_PEER_FAILED, "{}: peer {} is gone", kName, peer->remote);
    }
    {
      std::lock_guard inbox_lock(it->second->mutex);
      it->second->inbox.emplace_back(bytes, bytes + bucket->data.size);
    }
    it->second->arrived.notify_all();
    *out = nullptr;
  });
}

ferry_error_t* recv_bucket(ferry_transport_t* t, ferry_peer_t* /*peer*/,
                           const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return ferry::sdk::guard([&] {
    std::uint8_t* bytes = range_bytes(bucket->data, "recv_bucket data");
    std::unique_lock lock(t->mutex);
    while (t->inbox.empty()) {
      const std::int64_t left = bucket->deadline_ns - monotonic_now_ns();
      if (left <= 0) {
        fail(FERRY_STATUS_TIMEOUT, "{}: no bucket {} arrived before the deadline", kName,
             bucket->bucket_index);
      }
      t->arrived.wait_for(lock, std::chrono::nanoseconds(left));
    }
    std::vector<std::uint8_t> payload = std::move(t->inbox.front());
    t->inbox.pop_front();
    if (payload.size() > bucket->data.size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: bucket of {} bytes, receive range of {}", kName,
           payload.size(), bucket->data.size);
    }
    std::memcpy(bytes, payload.data(), payload.size());
    *out = nullptr;
  });
}

const ferry_transport_api_t kLoopApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    get_caps,
    create,
    destroy,
    get_address,
    connect,
    disconnect,
    register_memory,
    pack_key,
    deregister_memory,
    send_bucket,
    recv_bucket,
    put,
    flush,
    nullptr,  // request_test: every call completes before it returns
    nullptr,  // request_wait
    nullptr,  // request_free
    nullptr,  // abort
    nullptr,  // source_open
    nullptr,  // source_catalog
    nullptr,  // source_read
    nullptr,  // source_close
    nullptr,  // put_many
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_TRANSPORT, kName, "0.1-test", &kLoopApi);
}
