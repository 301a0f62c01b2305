// group/receiver_groups.hpp: the receiver's weight-update groups (SGLang's
// init_weights_update_group / update_weights_from_distributed / destroy_weights_update_group):
// the request an update acts on (parsed by control/requests.hpp) and WeightUpdateGroups, which
// joins groups through the broadcast transport of the request's backend (update.group_transport
// for nccl, update.gloo_transport for gloo), receives an update's buckets by broadcast into
// staging (double buffered: bucket k+1 arrives while bucket k is applied) and applies them
// through the receiver's update engine as one transaction.
//
// What one broadcast carries depends on who rank 0 is. ferry's own rank 0 (ferry.NcclGroup,
// met at ferry's rendezvous) broadcasts the bucket layout both sides derive (broadcast_layout).
// A torch trainer (a transport with CAP_GROUP_RENDEZVOUS) broadcasts what SGLang's engine
// receives: one broadcast per tensor, in the request's order, or with load_format
// "flattened_bucket" one broadcast of every tensor's bytes back to back (SGLang's
// FlattenedTensorBucket), which is then unpacked into aligned buckets.
//
// Ownership: whoever serves the control operations owns one WeightUpdateGroups per receiver (the
// HTTP server; the C API for an embedded receiver). Destroying it destroys every group.
// Threading: every method may be called from any thread; they are serialized internally.
// Without NCCL in the build, an nccl group's init answers UNIMPLEMENTED.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "group/broadcast_group.hpp"
#include <ferry/formats/broadcast_layout.hpp>
#include "receiver/engine_control.hpp"
#include "receiver/receiver.hpp"

namespace ferry::receiver {

struct DistributedUpdate {
  std::vector<nccl::TensorSpec> tensors;  // in the order rank 0 packs them
  std::string group_name;
  std::optional<std::string> weight_version;
  // SGLang's fields around the update: the control routes run them (EngineControl::run_update),
  // WeightUpdateGroups::update does not read them.
  UpdateEffects effects;
  // ferry's optional fields; rank 0 must use the same bucket_bytes (README.md).
  std::uint64_t bucket_bytes = nccl::kDefaultBucketBytes;
  std::chrono::milliseconds bucket_timeout{120000};
  // SGLang's load_format "flattened_bucket": rank 0 broadcasts all tensors as one byte tensor
  // (a torch trainer's group only).
  bool flattened = false;
};

class WeightUpdateGroups {
 public:
  // `receiver` must outlive this object.
  explicit WeightUpdateGroups(Receiver& receiver);
  ~WeightUpdateGroups();
  WeightUpdateGroups(const WeightUpdateGroups&) = delete;
  WeightUpdateGroups& operator=(const WeightUpdateGroups&) = delete;

  // Joins group `init.group_name` as rank rank_offset + receiver.tp_rank: nccl on the receiver's
  // CUDA device (receiver.device cuda:N; device 0 for a CPU receiver), gloo in host memory.
  // Blocks until rank 0 and every rank joined or the timeout passed. A group of that name that
  // failed earlier is destroyed first; a ready one is FAILED_PRECONDITION.
  void init(nccl::GroupInit init);

  // Receives one update from rank 0 of the group and applies it as one transaction (published
  // on commit only). On any failure the group is aborted and marked failed (re-init it), the
  // update is aborted (the previous version stays, restored or fenced) and the error names the
  // bucket and the phase.
  UpdateReport update(const DistributedUpdate& request);

  // Leaves and destroys the group within `timeout`: finalized when rank 0 (and every rank) is
  // destroying at the same time, aborted locally when this destroy is one-sided (after at most
  // nccl::kLeaveWindow) or the group failed, left for a healthy torch trainer's group (each rank
  // leaves on its own). Returns how ("finalized", "aborted", "left", or "continuing in the
  // background" when the transport's teardown outlived the timeout). NOT_FOUND for an unknown
  // group; TIMEOUT when an update of this receiver holds the groups past the timeout.
  std::string destroy(const std::string& group_name,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(15000));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::receiver
