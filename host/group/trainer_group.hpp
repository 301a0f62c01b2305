// group/trainer_group.hpp: the trainer's side of an NCCL weight-update group: rank 0, which
// serves the rendezvous (the NCCL unique id) on master_address:master_port, and broadcasts each
// update as buckets packed from the trainer's tensors, double buffered (bucket k+1 is packed
// while bucket k is broadcast). Receivers join with /init_weights_update_group and receive with
// /update_weights_from_distributed carrying update_request() of the same tensors.
//
// The C API (host/capi/nccl.cpp, ferry_nccl_group_*) and Python (ferry.NcclGroup) wrap it.
// Threading: one thread drives a group; abort() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ferry/formats/broadcast_layout.hpp>
#include "session/sender/sender.hpp"

namespace ferry::registry {
class Registry;
}

namespace ferry::session {

struct NcclTrainerOptions {
  std::string transport;  // the broadcast transport plugin (the config's update.group_transport)
  std::string master_address = "127.0.0.1";  // where rank 0 listens (receivers connect there)
  std::uint16_t master_port = 0;  // 0: any free port (only for world_size 1: receivers must know it)
  std::uint32_t world_size = 0;               // trainer + every receiver rank
  std::string group_name = "weight_update_group";
  int device = 0;                              // CUDA device of rank 0
  std::chrono::milliseconds init_timeout{120000};  // rendezvous + communicator init
  std::uint64_t bucket_bytes = nccl::kDefaultBucketBytes;  // receivers must be told the same
  std::chrono::milliseconds bucket_timeout{120000};
};

struct BroadcastReport {
  std::uint64_t bytes = 0;  // bucket bytes broadcast (tensors plus alignment gaps)
  std::uint64_t tensors = 0;
  std::uint64_t buckets = 0;
  double seconds = 0;
};

class NcclTrainerGroup {
 public:
  // Creates the group as rank 0: blocks until every rank joined and the communicator exists, or
  // init_timeout passed (TIMEOUT naming the missing ranks). FAILED_PRECONDITION without a GPU.
  // `registry` (which provides the nccl transport) must outlive the group.
  NcclTrainerGroup(const registry::Registry& registry, NcclTrainerOptions options);
  // close(15 s) unless close() ran.
  ~NcclTrainerGroup();
  NcclTrainerGroup(const NcclTrainerGroup&) = delete;
  NcclTrainerGroup& operator=(const NcclTrainerGroup&) = delete;

  // Broadcasts one update: `tensors` in this order, each in CUDA memory of options.device or in
  // host memory, unchanged until the call returns. Every receiver must be receiving the same
  // list (update_request()). On failure the communicator is aborted on every rank (receivers
  // learn it through their rendezvous link), the error names the bucket, the phase and any rank
  // that left, and the group must be re-initialised (reinit()) before the next update.
  BroadcastReport broadcast(const std::vector<TensorView>& tensors);

  // Re-creates the group after a failure: the stale communicator is destroyed first, then
  // rank 0 serves a new rendezvous on the same address (receivers init again).
  void reinit();

  // Any thread: a broadcast in flight fails with ABORTED and the group is marked failed.
  void abort(const std::string& reason) noexcept;

  bool failed() const;

  // destroy_weights_update_group on rank 0, bounded by `timeout`: finalizes the communicator
  // when every receiver destroys its side at the same time (POST /destroy_weights_update_group
  // concurrently, as SGLang's trainer does), aborts it locally otherwise (one-sided, after at
  // most 2 s) or after a failure. Returns "finalized", "aborted", "continuing in the background"
  // (NCCL's teardown outlived the timeout) or "closed" (already). The group is unusable after.
  std::string close(std::chrono::milliseconds timeout);

  // The JSON body of POST /update_weights_from_distributed for `tensors` (names, dtypes, shapes,
  // group_name, bucket_bytes, timeout_s, weight_version when given).
  std::string update_request(const std::vector<TensorView>& tensors,
                             const std::optional<std::string>& weight_version) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::session
