// group/broadcast_group.hpp: one member of a weight-update group as the host sees it: the
// rendezvous over TCP (rank 0 serves the NCCL unique id, the others fetch it), then a broadcast
// transport plugin driven through its C table (get_address / connect / register_memory /
// send_bucket or recv_bucket / request_wait / abort). Waits are sliced so that a rank whose
// rendezvous link closed is named at once, instead of when the bucket's deadline passes.
// A transport declaring FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS (torch_gloo: a group an unmodified
// torch trainer created) meets its group itself at rank 0's store: then ferry's rendezvous, its
// liveness links and its leave handshake are skipped, and the plugin names a dead peer.
//
// Used by the receiver (host/receiver/receiver_nccl.cpp), the trainer
// (host/session/nccl_group.cpp) and `ferry bench nccl`. Needs no CUDA itself: device memory is
// allocated by the caller and only registered here.
//
// Threading: one thread uses a BroadcastGroup; abort() may be called from any thread.
#pragma once

#include <ferry/plugin.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "group/rendezvous.hpp"

namespace ferry::nccl {

// SGLang's init_weights_update_group fields plus what ferry needs to place the rank.
struct GroupInit {
  std::string master_address;
  std::uint16_t master_port = 0;
  std::uint32_t rank_offset = 0;  // SGLang: the first rank of this engine in the group
  std::uint32_t world_size = 0;
  std::string group_name;
  std::string backend = "nccl";     // "nccl" or "gloo" (torch.distributed's names)
  std::uint32_t rank = 0;           // this process: 0 for the trainer, rank_offset + tp rank else
  int device = 0;                   // CUDA device ordinal of this rank; -1: none (gloo)
  std::chrono::milliseconds init_timeout{120000};  // rendezvous + communicator init
};

// INVALID_ARGUMENT naming the field: empty address or group, world_size 0, rank outside it,
// a backend other than "nccl" and "gloo".
void check_group_init(const GroupInit& init);

class BroadcastGroup {
 public:
  // Joins the group (rank 0 serves the rendezvous first). `api` is the NCCL transport's table
  // (from the registry) and `host` the host's services table (to free errors); both must outlive
  // the group. TIMEOUT / PEER_FAILED naming the phase and the missing ranks; FAILED_PRECONDITION
  // without a usable GPU (the plugin's create refuses it).
  BroadcastGroup(const ferry_transport_api_t* api, const ferry_host_api_t* host, GroupInit init);
  // close(now + kDefaultCloseTimeout, healthy: not aborted) unless close() ran.
  ~BroadcastGroup();
  BroadcastGroup(const BroadcastGroup&) = delete;
  BroadcastGroup& operator=(const BroadcastGroup&) = delete;

  // Registers device memory (CUDA, this rank's device) as a bucket buffer; freed with the group.
  ferry_memory_t* register_device(void* base, std::uint64_t bytes);
  // Registers host memory as a bucket buffer (a transport that moves host memory: gloo).
  ferry_memory_t* register_host(void* base, std::uint64_t bytes);
  // The transport's capabilities (get_caps at construction).
  const ferry_transport_caps_t& caps() const { return caps_; }
  // The transport met the group at rank 0's own rendezvous (CAP_GROUP_RENDEZVOUS).
  bool own_rendezvous() const { return (caps_.flags & FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS) != 0; }

  // One bucket in flight: rank 0 sends, the others receive, `bytes` at `offset` of `memory`.
  struct Pending {
    ferry_request_t* request = nullptr;
    std::uint32_t bucket_index = 0;
    Clock::time_point deadline;
  };
  Pending issue(ferry_memory_t* memory, std::uint64_t offset, std::uint64_t bytes,
                std::uint32_t bucket_index, std::chrono::milliseconds timeout);
  // Waits for `pending` (then frees its request). Every 100 ms checks the rendezvous links: a
  // closed link aborts the communicator and throws PEER_FAILED naming the rank. The bucket's
  // deadline aborts it with TIMEOUT naming the phase and, where known, the dead ranks.
  void wait(Pending& pending);
  // Frees a request without waiting (aborts the communicator if it still runs).
  void discard(Pending& pending) noexcept;

  // Any thread: every wait in flight fails with ABORTED, the communicator is aborted and the
  // rendezvous links are shut down, so the other ranks name this one within a wait slice.
  void abort(const std::string& reason) noexcept;

  // How a close() went.
  enum class CloseOutcome {
    finalized,   // every rank left together: the communicator was finalized and destroyed
    aborted,     // one-sided, failed or unhealthy: aborted locally
    background,  // the deadline passed first: the teardown goes on on a detached thread
    left,        // a group met at rank 0's own rendezvous (torch): each rank leaves on its own
  };
  // destroy_weights_update_group. A healthy group (`healthy` and never aborted) runs the leave
  // handshake with its peers (rendezvous.hpp) for at most kLeaveWindow: when every peer is
  // leaving too the plugin finalizes the communicator (collective), otherwise it aborts it
  // (local). The teardown (deregister, disconnect, destroy, then `after`, e.g. freeing the
  // registered memory) runs on a detached thread that this call waits for until `deadline`, so
  // NCCL can never hold the caller past it. Idempotent: a second call returns `aborted` at once.
  CloseOutcome close(Clock::time_point deadline, bool healthy, std::function<void()> after = {});

  const GroupInit& init() const { return init_; }
  std::uint32_t rank() const { return init_.rank; }
  // Ranks whose rendezvous link closed (rank 0: any joiner; others: 0 when rank 0 is gone).
  // Empty after this rank's own abort (its links read as closed then).
  std::vector<std::uint32_t> dead_ranks() const;

 private:
  [[noreturn]] void rethrow(ferry_error_t* error, const std::string& context);
  std::string where() const;
  ferry_memory_t* register_memory(void* base, std::uint64_t bytes, ferry_memory_kind_t kind);

  const ferry_transport_api_t* api_;
  const ferry_host_api_t* host_;
  GroupInit init_;
  ferry_transport_caps_t caps_{};
  ferry_transport_t* transport_ = nullptr;
  ferry_peer_t* peer_ = nullptr;
  std::vector<ferry_memory_t*> registrations_;
  std::unique_ptr<RendezvousServer> server_;  // rank 0
  std::unique_ptr<RendezvousClient> client_;  // ranks > 0
  std::atomic<bool> aborted_{false};
  bool closed_ = false;
};

inline constexpr auto kLeaveWindow = std::chrono::seconds(2);
inline constexpr auto kDefaultCloseTimeout = std::chrono::seconds(15);

const char* close_outcome_name(BroadcastGroup::CloseOutcome outcome);

}  // namespace ferry::nccl
