// torch_gloo/torch_gloo_transport.hpp: one instance of the torch_gloo broadcast transport: the
// objects behind the opaque handles, with the methods of the SDK's broadcast, memory, async and
// abort groups (ferry/sdk/transport_plugin.hpp; README.md). It declares
// FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS: the group meets at the trainer's TCPStore, not at ferry's
// rendezvous.
//   address      refused: nothing to carry, the host names rank 0's store instead
//   connect      joins the torch.distributed gloo group: remote_addresses[0] is "host:port" of
//                rank 0's TCPStore, peer_name the group name; blocks until every rank joined
//                (the backend library, and with it libtorch, is loaded here, once)
//   send_bucket  rank 0: one broadcast of the bucket's bytes; recv_bucket: ranks > 0, the same
//   request_*    wait in slices of 50 ms: abort() ends a wait with ABORTED at once; a broadcast
//                still running is kept (its memory stays in use) until the peer is disconnected
//   abort        any thread
// Memory: host memory (pageable or pinned) only.
#pragma once

#include <ferry/plugin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "torch_gloo/gloo_backend.hpp"

struct ferry_peer {
  std::unique_ptr<ferry::torch_gloo::Group> group;
  // Broadcasts whose requests were freed before they ended: they may still write into the
  // host's memory, so they live until the group is gone (its destructor joins them).
  std::vector<std::unique_ptr<ferry::torch_gloo::PendingBroadcast>> orphans;
  std::uint32_t rank = 0;
  ~ferry_peer();
};

struct ferry_memory {
  std::uint8_t* base = nullptr;
  std::uint64_t size = 0;
};

struct ferry_request {
  ferry_peer* peer = nullptr;
  std::unique_ptr<ferry::torch_gloo::PendingBroadcast> broadcast;
  std::uint32_t bucket_index = 0;
  std::int64_t hard_deadline_ns = 0;
  bool complete = false;
  ferry::torch_gloo::Outcome outcome;
};

struct ferry_transport {
  // Options: `interface` (the network interface gloo's connections use, as torch's
  // GLOO_SOCKET_IFNAME) and `store_prefixes` (comma-separated key prefixes between the TCPStore
  // and the process group, "{group}" for the group name; default: SGLang's chain for the torch
  // the backend was built with).
  explicit ferry_transport(const ferry_transport_create_args_t& args);
  ~ferry_transport();
  ferry_transport(const ferry_transport&) = delete;
  ferry_transport& operator=(const ferry_transport&) = delete;

  std::vector<std::uint8_t> address();
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer) noexcept;
  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  void deregister_memory(ferry_memory* memory) noexcept;
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  bool request_test(ferry_request* request);
  void request_wait(ferry_request* request, std::int64_t deadline_ns);
  void request_free(ferry_request* request) noexcept;
  void abort(const char* reason) noexcept;

 private:
  ferry_request* issue(ferry_peer* peer, const ferry_bucket_io_t& bucket, bool root);
  // Ends the request's broadcast: rethrows its failure as ferry::Error.
  void settle(ferry_request* request);

  ferry_role_t role_ = FERRY_ROLE_SENDER;
  std::string interface_;
  std::vector<std::string> prefixes_;
  std::atomic<bool> aborted_{false};
  std::mutex reason_mutex_;
  std::string abort_reason_;
};
