// nccl/nccl_plugin.cpp: the C entry of libferry_transport_nccl.so: negotiation and the
// ferry_transport_api_t table of the NCCL broadcast transport (README.md, "The transport ABI").
//   get_address  rank 0 (role SENDER) only: the NCCL unique id (128 bytes), for the host to carry
//   connect      joins the group: local_rank, group_size; ranks > 0 pass rank 0's id as
//                remote_addresses[0]; non-blocking init polled until args->deadline_ns
//   send_bucket  rank 0: ncclBroadcast of the bucket (in place) to every rank; async
//   recv_bucket  ranks > 0: the same collective, receiving into the bucket; async
//   request_*    test / wait poll the CUDA event and ncclCommGetAsyncError; the bucket's own
//                deadline_ns is the hard one (the communicator is aborted), a request_wait
//                deadline before it only returns TIMEOUT with the request still valid
//   abort        any thread: every wait in flight aborts its communicator and returns ABORTED
// Every function is wrapped in sdk::guard, so no exception crosses the ABI.
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "nccl/nccl_comm.hpp"

#ifndef FERRY_NCCL_VERSION
#define FERRY_NCCL_VERSION "unknown"
#endif

struct ferry_peer {
  std::unique_ptr<ferry::nccl::Communicator> comm;
  // Completion events of freed requests, reused: creating and destroying one per bucket costs
  // microseconds on every broadcast. Used by the serialized thread only.
  std::vector<cudaEvent_t> spare_events;

  ~ferry_peer() {
    if (comm) cudaSetDevice(comm->device());
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
  }
};

struct ferry_transport {
  ferry_role_t role = FERRY_ROLE_SENDER;
  int device = 0;
  std::optional<ncclUniqueId> id;  // rank 0, after get_address
  std::mutex peers_mutex;          // abort() reads peers from any thread
  std::vector<ferry_peer*> peers;  // guarded by peers_mutex
};

struct ferry_memory {
  std::uint8_t* base = nullptr;
  std::uint64_t size = 0;
};

struct ferry_request {
  ferry_peer* peer = nullptr;
  cudaEvent_t done = nullptr;
  std::uint32_t bucket_index = 0;
  std::int64_t hard_deadline_ns = 0;
  bool complete = false;
};

namespace {

using ferry::fail;
constexpr const char* kName = "nccl";

// Refuses a machine without a usable CUDA device with a message that says so.
void require_device(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "nccl transport: no CUDA device is usable on this machine ({}); NCCL broadcast needs "
         "one GPU per rank",
         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  if (device < 0 || device >= count) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "nccl transport: CUDA device {} does not exist ({} visible); set the device ordinal",
         device, count);
  }
}

ferry_error_t* nccl_get_caps(ferry_transport_caps_t* caps) {
  return ferry::sdk::guard([&] {
    if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl get_caps: caps is NULL or has no struct_size");
    }
    ferry_transport_caps_t full{};
    full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    full.flags = FERRY_TRANSPORT_CAP_BROADCAST | FERRY_TRANSPORT_CAP_ASYNC;
    full.memory_kinds = FERRY_MEMORY_CUDA;
    full.preferred_bucket_bytes = 256ull << 20;
    full.max_inflight_buckets = 2;  // double buffering
    const size_t size = std::min(caps->struct_size, full.struct_size);
    std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
    caps->struct_size = size;
  });
}

ferry_error_t* nccl_create(const ferry_transport_create_args_t* args, ferry_transport_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl create: args or out is NULL, or args too short");
    }
    *out = nullptr;
    for (size_t i = 0; i < args->num_options; ++i) {
      const std::string_view key = args->options[i].key ? args->options[i].key : "";
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl transport: unknown option '{}' (it takes none)",
           key);
    }
    if (args->role != FERRY_ROLE_SENDER && args->role != FERRY_ROLE_RECEIVER) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl create: role {} is neither sender nor receiver",
           static_cast<int>(args->role));
    }
    require_device(args->device);
    auto transport = std::make_unique<ferry_transport>();
    transport->role = args->role;
    transport->device = args->device;
    *out = transport.release();
  });
}

void nccl_disconnect(ferry_transport_t* transport, ferry_peer_t* peer) {
  if (transport == nullptr || peer == nullptr) return;
  {
    std::lock_guard lock(transport->peers_mutex);
    std::erase(transport->peers, peer);
  }
  delete peer;  // ~Communicator finalizes or aborts
}

void nccl_destroy(ferry_transport_t* transport) {
  if (transport == nullptr) return;
  std::vector<ferry_peer*> peers;
  {
    std::lock_guard lock(transport->peers_mutex);
    peers.swap(transport->peers);
  }
  for (ferry_peer* p : peers) delete p;
  delete transport;
}

ferry_error_t* nccl_get_address(ferry_transport_t* transport, ferry_blob_t* out) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || out == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl get_address: transport or out is NULL");
    }
    *out = ferry_blob_t{};
    if (transport->role != FERRY_ROLE_SENDER) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "nccl get_address: only rank 0 (role sender, the trainer) creates the group id");
    }
    if (!transport->id) {
      ncclUniqueId id{};
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        fail(FERRY_STATUS_IO, "nccl get_address: ncclGetUniqueId failed: {}",
             ncclGetErrorString(r));
      }
      transport->id = id;
    }
    auto* copy = new std::vector<std::uint8_t>(sizeof(ncclUniqueId));
    std::memcpy(copy->data(), &*transport->id, sizeof(ncclUniqueId));
    out->struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    out->data = copy->data();
    out->size = copy->size();
    out->release = [](const std::uint8_t*, void* ctx) {
      delete static_cast<std::vector<std::uint8_t>*>(ctx);
    };
    out->release_ctx = copy;
  });
}

ferry_error_t* nccl_connect(ferry_transport_t* transport, const ferry_connect_args_t* args,
                            ferry_peer_t** out) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || args == nullptr || out == nullptr ||
        args->struct_size < FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl connect: an argument is NULL or args too short");
    }
    *out = nullptr;
    const std::string name = args->peer_name ? args->peer_name : "unnamed";
    if (args->group_size < 1 || args->local_rank >= args->group_size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl connect '{}': rank {} is outside group size {}",
           name, args->local_rank, args->group_size);
    }
    ncclUniqueId id{};
    if (args->local_rank == 0) {
      if (transport->role != FERRY_ROLE_SENDER || !transport->id) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "nccl connect '{}': rank 0 must be the sender and call get_address first", name);
      }
      id = *transport->id;
    } else {
      if (args->num_remote < 1 || args->remote_addresses == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "nccl connect '{}': rank {} needs rank 0's id as remote_addresses[0]", name,
             args->local_rank);
      }
      const ferry_blob_t& blob = args->remote_addresses[0];
      if (blob.data == nullptr || blob.size != sizeof(ncclUniqueId)) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "nccl connect '{}': rank 0's id is {} bytes, an NCCL unique id is {}", name,
             blob.size, sizeof(ncclUniqueId));
      }
      std::memcpy(&id, blob.data, sizeof id);
    }
    auto peer = std::make_unique<ferry_peer>();
    peer->comm = std::make_unique<ferry::nccl::Communicator>(
        id, static_cast<int>(args->local_rank), static_cast<int>(args->group_size),
        transport->device, name, args->deadline_ns);
    std::lock_guard lock(transport->peers_mutex);
    transport->peers.push_back(peer.get());
    *out = peer.release();
  });
}

ferry_error_t* nccl_register_memory(ferry_transport_t* transport, const ferry_memory_desc_t* desc,
                                    ferry_memory_t** out) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || desc == nullptr || out == nullptr ||
        desc->struct_size < FERRY_STRUCT_SIZE(ferry_memory_desc_t, device)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl register_memory: an argument is NULL");
    }
    *out = nullptr;
    if (desc->kind != FERRY_MEMORY_CUDA) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "nccl register_memory: memory kind {} is not CUDA device memory (NCCL broadcasts "
           "from and into device memory only)",
           static_cast<int>(desc->kind));
    }
    if (desc->device != transport->device) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "nccl register_memory: memory of device {} but the transport uses device {}",
           desc->device, transport->device);
    }
    if (desc->base == nullptr && desc->size > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl register_memory: base is NULL");
    }
    auto memory = std::make_unique<ferry_memory>();
    memory->base = static_cast<std::uint8_t*>(desc->base);
    memory->size = desc->size;
    *out = memory.release();
  });
}

void nccl_deregister_memory(ferry_transport_t*, ferry_memory_t* memory) { delete memory; }

ferry_error_t* issue(ferry_transport_t* transport, ferry_peer_t* peer,
                     const ferry_bucket_io_t* bucket, ferry_request_t** out, bool root) {
  return ferry::sdk::guard([&] {
    const char* what = root ? "send_bucket" : "recv_bucket";
    if (transport == nullptr || peer == nullptr || bucket == nullptr || out == nullptr ||
        bucket->struct_size < FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl {}: an argument is NULL or too short", what);
    }
    *out = nullptr;
    auto& comm = *peer->comm;
    if ((comm.rank() == 0) != root) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "nccl {}: rank {} of group '{}' cannot {} (rank 0 sends, the others receive)", what,
           comm.rank(), comm.name(), root ? "send" : "receive");
    }
    const ferry_memory_range_t& range = bucket->data;
    if (range.memory == nullptr || range.offset > range.memory->size ||
        range.size > range.memory->size - range.offset) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "nccl {}: bucket {} range [{}, +{}) is outside its registered memory", what,
           bucket->bucket_index, range.offset, range.size);
    }
    auto request = std::make_unique<ferry_request>();
    request->peer = peer;
    request->bucket_index = bucket->bucket_index;
    request->hard_deadline_ns = bucket->deadline_ns;
    cudaSetDevice(comm.device());
    if (!peer->spare_events.empty()) {
      request->done = peer->spare_events.back();
      peer->spare_events.pop_back();
    } else if (cudaError_t e = cudaEventCreateWithFlags(&request->done, cudaEventDisableTiming);
               e != cudaSuccess) {
      fail(FERRY_STATUS_INTERNAL, "nccl {}: cudaEventCreate failed: {}", what,
           cudaGetErrorString(e));
    }
    try {
      comm.broadcast(range.memory->base + range.offset, range.size, bucket->bucket_index,
                     request->done, bucket->deadline_ns);
    } catch (...) {
      cudaEventDestroy(request->done);
      throw;
    }
    *out = request.release();
  });
}

ferry_error_t* nccl_send_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                                const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return issue(transport, peer, bucket, out, true);
}

ferry_error_t* nccl_recv_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                                const ferry_bucket_io_t* bucket, ferry_request_t** out) {
  return issue(transport, peer, bucket, out, false);
}

ferry_error_t* nccl_request_test(ferry_transport_t* transport, ferry_request_t* request,
                                 int* done) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || request == nullptr || done == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl request_test: an argument is NULL");
    }
    *done = 0;
    if (!request->complete) {
      request->complete = request->peer->comm->test(request->done, request->bucket_index,
                                                     request->hard_deadline_ns);
    }
    *done = request->complete ? 1 : 0;
  });
}

ferry_error_t* nccl_request_wait(ferry_transport_t* transport, ferry_request_t* request,
                                 std::int64_t deadline_ns) {
  return ferry::sdk::guard([&] {
    if (transport == nullptr || request == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl request_wait: an argument is NULL");
    }
    auto& comm = *request->peer->comm;
    const std::int64_t since = ferry::nccl::monotonic_ns();
    while (!request->complete) {
      request->complete = comm.test(request->done, request->bucket_index,
                                    request->hard_deadline_ns);
      if (request->complete) break;
      if (deadline_ns > 0 && ferry::nccl::monotonic_ns() > deadline_ns) {
        fail(FERRY_STATUS_TIMEOUT,
             "nccl group '{}' rank {}: bucket {} not complete yet at the wait's deadline (the "
             "request stays valid)",
             comm.name(), comm.rank(), request->bucket_index);
      }
      ferry::nccl::poll_pause(since);
    }
  });
}

void nccl_request_free(ferry_transport_t*, ferry_request_t* request) {
  if (request == nullptr) return;
  if (!request->complete) {
    // A collective cannot be cancelled: the only way to stop it is to abort the communicator.
    int done = 0;
    try {
      done = request->peer->comm->test(request->done, request->bucket_index, 0) ? 1 : 0;
    } catch (...) {
      done = 1;  // it failed and was aborted
    }
    if (!done) request->peer->comm->abort("a request was freed before it completed");
  }
  if (request->complete) {
    try {
      request->peer->spare_events.push_back(request->done);  // completed: safe to record again
      request->done = nullptr;
    } catch (...) {
      // No room to keep it: destroyed below.
    }
  }
  if (request->done != nullptr) cudaEventDestroy(request->done);
  delete request;
}

void nccl_abort(ferry_transport_t* transport, const char* reason) {
  if (transport == nullptr) return;
  std::string why;
  try {
    why = reason ? reason : "";
  } catch (...) {
    // An empty reason still aborts.
  }
  std::lock_guard lock(transport->peers_mutex);
  for (ferry_peer* p : transport->peers) p->comm->request_abort(why);
}

const ferry_transport_api_t kApi = {
    FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close),
    nccl_get_caps,
    nccl_create,
    nccl_destroy,
    nccl_get_address,
    nccl_connect,
    nccl_disconnect,
    nccl_register_memory,
    nullptr,  // pack_key
    nccl_deregister_memory,
    nccl_send_bucket,
    nccl_recv_bucket,
    nullptr,  // put
    nullptr,  // flush
    nccl_request_test,
    nccl_request_wait,
    nccl_request_free,
    nccl_abort,
    nullptr,  // source_open
    nullptr,  // source_catalog
    nullptr,  // source_read
    nullptr,  // source_close
    nullptr,  // put_many
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, kName, FERRY_NCCL_VERSION,
                               &kApi, ferry::sdk::kNoOptions);  // it takes no options
}
