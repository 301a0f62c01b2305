// group/receiver_groups.hpp: the receiver's NCCL weight-update groups (SGLang's
// init_weights_update_group / update_weights_from_distributed / destroy_weights_update_group):
// the request an update acts on (parsed by control/requests.hpp) and WeightUpdateGroups, which
// joins groups through the nccl transport plugin, receives an update's buckets by broadcast into
// device staging (double buffered: bucket k+1 arrives while bucket k is applied) and applies
// them through the receiver's update engine as one transaction.
//
// Ownership: whoever serves the control operations owns one WeightUpdateGroups per receiver (the
// HTTP server; the C API for an embedded receiver). Destroying it destroys every group.
// Threading: every method may be called from any thread; they are serialized internally.
// Without NCCL in the build, init/update answer UNIMPLEMENTED.
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
};

class WeightUpdateGroups {
 public:
  // `receiver` must outlive this object.
  explicit WeightUpdateGroups(Receiver& receiver);
  ~WeightUpdateGroups();
  WeightUpdateGroups(const WeightUpdateGroups&) = delete;
  WeightUpdateGroups& operator=(const WeightUpdateGroups&) = delete;

  // Joins group `init.group_name` as rank rank_offset + receiver.tp_rank on the receiver's CUDA
  // device (receiver.device cuda:N; device 0 for a CPU receiver). Blocks until rank 0 and every
  // rank joined or the timeout passed. A group of that name that failed earlier is destroyed
  // first; a ready one is FAILED_PRECONDITION.
  void init(nccl::GroupInit init);

  // Receives one update from rank 0 of the group and applies it as one transaction (published
  // on commit only). On any failure the group is aborted and marked failed (re-init it), the
  // update is aborted (the previous version stays, restored or fenced) and the error names the
  // bucket and the phase.
  UpdateReport update(const DistributedUpdate& request);

  // Leaves and destroys the group within `timeout`: finalized when rank 0 (and every rank) is
  // destroying at the same time, aborted locally when this destroy is one-sided (after at most
  // nccl::kLeaveWindow) or the group failed. Returns how ("finalized", "aborted", or "continuing
  // in the background" when NCCL's teardown outlived the timeout). NOT_FOUND for an unknown
  // group; TIMEOUT when an update of this receiver holds the groups past the timeout.
  std::string destroy(const std::string& group_name,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(15000));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::receiver
