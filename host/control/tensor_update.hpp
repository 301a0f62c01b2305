// control/tensor_update.hpp: the tensors of /update_weights_from_tensor calls, applied as each
// call brings them, until they make one update: SGLang's clients send a model in several calls
// (a bucket each), and ferry's update is one transaction that covers every parameter. The first
// call begins the update (receiver::FedUpdate: the update lock is held until it ends); each
// storage a call names becomes one bucket read straight from the trainer's memory while the call
// runs (a CUDA IPC allocation on the weights' GPU, or a shared-memory file), through the update
// loop, so the weights are read once and written once; a CUDA tensor on another device (or into
// host weights) is copied to host memory first. Outside a weight-update session the update
// commits in the call that completes the checkpoint; inside one, at /end_weight_update. A failed
// call aborts the update, and so does a client that sends nothing for
// update.staged_tensors_timeout_ms (the control server's reaper): the weights written so far are
// restored from the host mirror, or the receiver is fenced; the published version stays.
//
// Threading: one PendingTensorUpdate per server, used under its mutex.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/manifest.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "control/tensor_payload.hpp"
#include "receiver/fed_update.hpp"
#include "receiver/receiver.hpp"

namespace ferry::control {

class PendingTensorUpdate {
 public:
  // Checks `request`'s tensors against `catalog` (names, dtypes, shapes; INVALID_ARGUMENT naming
  // the first that differs, or one sent before in this update) before anything is written, then
  // applies them into `receiver`, beginning the update when none is in progress (`idle_timeout`:
  // the longest wait for the next call). Returns how many it applied. The caller discards the
  // update when this throws.
  std::size_t stage(const TensorUpdateRequest& request,
                    const std::vector<ferry_tensor_desc_t>& catalog, receiver::Receiver& receiver,
                    std::chrono::milliseconds idle_timeout);
  // The catalog the update in progress checks against (the receiver's own needs the update
  // lock, which that update holds), or nullptr when none is in progress.
  const std::vector<ferry_tensor_desc_t>* catalog() const {
    return update_ ? &catalog_ : nullptr;
  }
  // Every tensor of `catalog` is staged.
  bool covers(const std::vector<ferry_tensor_desc_t>& catalog) const;
  std::size_t size() const { return names_.size(); }
  bool contains(const std::string& name) const { return names_.contains(name); }
  bool empty() const { return names_.empty(); }
  // Bytes of the tensors applied in the update in progress.
  std::uint64_t bytes() const { return bytes_; }
  // Commits the update in progress (label: the last weight_version given) and empties.
  receiver::UpdateReport commit();
  // Aborts the update in progress (the published version stays), naming `reason`.
  void discard(const std::string& reason = "the update was discarded");
  // Discards the update in progress when the last stage() is older than `timeout` at `now` (the
  // client went away between its calls); true when it did.
  bool discard_if_idle(std::chrono::steady_clock::time_point now,
                       std::chrono::milliseconds timeout);

 private:
  std::vector<ferry_tensor_desc_t> catalog_;  // what update_ was opened with
  std::unique_ptr<receiver::FedUpdate> update_;
  std::uint32_t buckets_ = 0;
  std::uint64_t bytes_ = 0;
  std::set<std::string> names_;
  std::optional<std::string> label_;
  std::chrono::steady_clock::time_point last_staged_{};
};

}  // namespace ferry::control
