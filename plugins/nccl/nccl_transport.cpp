// nccl/nccl_transport.cpp: the NCCL broadcast transport's instances, groups, registrations and
// requests (see nccl/nccl_transport.hpp).
#include "nccl/nccl_transport.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

using ferry::fail;

namespace {

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

}  // namespace

ferry_peer::~ferry_peer() {
  if (comm) cudaSetDevice(comm->device());
  for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
}

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args) {
  for (size_t i = 0; i < args.num_options; ++i) {
    const std::string_view key = args.options[i].key ? args.options[i].key : "";
    fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl transport: unknown option '{}' (it takes none)", key);
  }
  if (args.role != FERRY_ROLE_SENDER && args.role != FERRY_ROLE_RECEIVER) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl create: role {} is neither sender nor receiver",
         static_cast<int>(args.role));
  }
  require_device(args.device);
  role = args.role;
  device = args.device;
}

ferry_transport::~ferry_transport() {
  std::vector<ferry_peer*> left;
  {
    std::lock_guard lock(peers_mutex);
    left.swap(peers);
  }
  for (ferry_peer* p : left) delete p;
}

void ferry_transport::disconnect(ferry_peer* peer) {
  {
    std::lock_guard lock(peers_mutex);
    std::erase(peers, peer);
  }
  delete peer;  // ~Communicator finalizes or aborts
}

std::vector<std::uint8_t> ferry_transport::address() {
  if (role != FERRY_ROLE_SENDER) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "nccl get_address: only rank 0 (role sender, the trainer) creates the group id");
  }
  if (!id) {
    ncclUniqueId fresh{};
    if (ncclResult_t r = ncclGetUniqueId(&fresh); r != ncclSuccess) {
      fail(FERRY_STATUS_IO, "nccl get_address: ncclGetUniqueId failed: {}", ncclGetErrorString(r));
    }
    id = fresh;
  }
  std::vector<std::uint8_t> bytes(sizeof(ncclUniqueId));
  std::memcpy(bytes.data(), &*id, sizeof(ncclUniqueId));
  return bytes;
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  const std::string name = args.peer_name ? args.peer_name : "unnamed";
  if (args.group_size < 1 || args.local_rank >= args.group_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl connect '{}': rank {} is outside group size {}", name,
         args.local_rank, args.group_size);
  }
  ncclUniqueId group_id{};
  if (args.local_rank == 0) {
    if (role != FERRY_ROLE_SENDER || !id) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "nccl connect '{}': rank 0 must be the sender and call get_address first", name);
    }
    group_id = *id;
  } else {
    if (args.num_remote < 1 || args.remote_addresses == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "nccl connect '{}': rank {} needs rank 0's id as remote_addresses[0]", name,
           args.local_rank);
    }
    const ferry_blob_t& blob = args.remote_addresses[0];
    if (blob.data == nullptr || blob.size != sizeof(ncclUniqueId)) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "nccl connect '{}': rank 0's id is {} bytes, an NCCL unique id is {}", name, blob.size,
           sizeof(ncclUniqueId));
    }
    std::memcpy(&group_id, blob.data, sizeof group_id);
  }
  auto peer = std::make_unique<ferry_peer>();
  peer->comm = std::make_unique<ferry::nccl::Communicator>(
      group_id, static_cast<int>(args.local_rank), static_cast<int>(args.group_size), device, name,
      args.deadline_ns);
  std::lock_guard lock(peers_mutex);
  peers.push_back(peer.get());
  return peer.release();
}

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.struct_size < FERRY_STRUCT_SIZE(ferry_memory_desc_t, device)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl register_memory: the memory desc has no device");
  }
  if (desc.kind != FERRY_MEMORY_CUDA) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "nccl register_memory: memory kind {} is not CUDA device memory (NCCL broadcasts "
         "from and into device memory only)",
         static_cast<int>(desc.kind));
  }
  if (desc.device != device) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "nccl register_memory: memory of device {} but the transport uses device {}", desc.device,
         device);
  }
  if (desc.base == nullptr && desc.size > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "nccl register_memory: base is NULL");
  }
  auto memory = std::make_unique<ferry_memory>();
  memory->base = static_cast<std::uint8_t*>(desc.base);
  memory->size = desc.size;
  return memory.release();
}

void ferry_transport::deregister_memory(ferry_memory* memory) noexcept {
  delete memory;
}

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  return issue(peer, bucket, true);
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  return issue(peer, bucket, false);
}

ferry_request* ferry_transport::issue(ferry_peer* peer, const ferry_bucket_io_t& bucket,
                                      bool root) {
  const char* what = root ? "send_bucket" : "recv_bucket";
  auto& comm = *peer->comm;
  if ((comm.rank() == 0) != root) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "nccl {}: rank {} of group '{}' cannot {} (rank 0 sends, the others receive)", what,
         comm.rank(), comm.name(), root ? "send" : "receive");
  }
  const ferry_memory_range_t& range = bucket.data;
  if (range.memory == nullptr || range.offset > range.memory->size ||
      range.size > range.memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "nccl {}: bucket {} range [{}, +{}) is outside its registered memory", what,
         bucket.bucket_index, range.offset, range.size);
  }
  auto request = std::make_unique<ferry_request>();
  request->peer = peer;
  request->bucket_index = bucket.bucket_index;
  request->hard_deadline_ns = bucket.deadline_ns;
  cudaSetDevice(comm.device());
  if (!peer->spare_events.empty()) {
    request->done = peer->spare_events.back();
    peer->spare_events.pop_back();
  } else if (cudaError_t e = cudaEventCreateWithFlags(&request->done, cudaEventDisableTiming);
             e != cudaSuccess) {
    fail(FERRY_STATUS_INTERNAL, "nccl {}: cudaEventCreate failed: {}", what, cudaGetErrorString(e));
  }
  try {
    comm.broadcast(range.memory->base + range.offset, range.size, bucket.bucket_index,
                   request->done, bucket.deadline_ns);
  } catch (...) {
    cudaEventDestroy(request->done);
    throw;
  }
  return request.release();
}

bool ferry_transport::request_test(ferry_request* request) {
  if (!request->complete) {
    request->complete =
        request->peer->comm->test(request->done, request->bucket_index, request->hard_deadline_ns);
  }
  return request->complete;
}

void ferry_transport::request_wait(ferry_request* request, std::int64_t deadline_ns) {
  auto& comm = *request->peer->comm;
  const std::int64_t since = ferry::nccl::monotonic_ns();
  while (!request->complete) {
    request->complete = comm.test(request->done, request->bucket_index, request->hard_deadline_ns);
    if (request->complete) break;
    if (deadline_ns > 0 && ferry::nccl::monotonic_ns() > deadline_ns) {
      fail(FERRY_STATUS_TIMEOUT,
           "nccl group '{}' rank {}: bucket {} not complete yet at the wait's deadline (the "
           "request stays valid)",
           comm.name(), comm.rank(), request->bucket_index);
    }
    ferry::nccl::poll_pause(since);
  }
}

void ferry_transport::request_free(ferry_request* request) noexcept {
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

void ferry_transport::abort(const char* reason) noexcept {
  std::string why;
  try {
    why = reason ? reason : "";
  } catch (...) {
    // An empty reason still aborts.
  }
  std::lock_guard lock(peers_mutex);
  for (ferry_peer* p : peers) p->comm->request_abort(why);
}
