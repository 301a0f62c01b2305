// nccl/nccl_transport.hpp: one instance of the NCCL broadcast transport, its groups (peers: one
// non-blocking communicator each), registrations and requests: the objects behind the opaque
// handles, with the methods of the SDK's broadcast, memory, async and abort groups
// (ferry/sdk/transport_plugin.hpp; README.md, "The transport ABI"):
//   address      rank 0 (role SENDER) only: the NCCL unique id (128 bytes), for the host to carry
//   connect      joins the group: local_rank, group_size; ranks > 0 pass rank 0's id as
//                remote_addresses[0]; non-blocking init polled until args.deadline_ns
//   send_bucket  rank 0: ncclBroadcast of the bucket (in place) to every rank; async
//   recv_bucket  ranks > 0: the same collective, receiving into the bucket; async
//   request_*    test / wait poll the CUDA event and ncclCommGetAsyncError; the bucket's own
//                deadline_ns is the hard one (the communicator is aborted), a request_wait
//                deadline before it only returns TIMEOUT with the request still valid
//   abort        any thread: every wait in flight aborts its communicator and returns ABORTED
#pragma once

#include <ferry/plugin.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "nccl/nccl_comm.hpp"

struct ferry_peer {
  std::unique_ptr<ferry::nccl::Communicator> comm;
  // Completion events of freed requests, reused: creating and destroying one per bucket costs
  // microseconds on every broadcast. Used by the serialized thread only.
  std::vector<cudaEvent_t> spare_events;

  ~ferry_peer();
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

struct ferry_transport {
  // Refuses options (it takes none), an unknown role and a machine without the CUDA device
  // args.device.
  explicit ferry_transport(const ferry_transport_create_args_t& args);
  // Frees the peers still connected (~Communicator finalizes or aborts).
  ~ferry_transport();
  ferry_transport(const ferry_transport&) = delete;
  ferry_transport& operator=(const ferry_transport&) = delete;

  std::vector<std::uint8_t> address();
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer);
  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  void deregister_memory(ferry_memory* memory) noexcept;
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  bool request_test(ferry_request* request);
  void request_wait(ferry_request* request, std::int64_t deadline_ns);
  void request_free(ferry_request* request) noexcept;
  void abort(const char* reason) noexcept;

  ferry_role_t role = FERRY_ROLE_SENDER;
  int device = 0;
  std::optional<ncclUniqueId> id;  // rank 0, after get_address
  std::mutex peers_mutex;          // abort() reads peers from any thread
  std::vector<ferry_peer*> peers;  // guarded by peers_mutex

 private:
  // send_bucket (root) and recv_bucket: the broadcast of one bucket.
  ferry_request* issue(ferry_peer* peer, const ferry_bucket_io_t& bucket, bool root);
};
