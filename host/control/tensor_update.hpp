// control/tensor_update.hpp: the tensors of /update_weights_from_tensor calls, copied from the
// trainer's memory into host buckets while each call runs, until they make one update: SGLang's
// clients send a model in several calls (a bucket each), and ferry's update is one transaction
// that covers every parameter. Outside a weight-update session the update commits in the call
// that completes the checkpoint; inside one, at /end_weight_update. It is applied through the
// update loop (Receiver::apply_update: buckets in memory), fingerprinted and versioned like any
// update; a failed call discards what was pending (the published version stays), and so does a
// client that sends nothing for update.staged_tensors_timeout_ms (the control server's reaper).
//
// Threading: one PendingTensorUpdate per server, used under its mutex.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/manifest.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "control/tensor_payload.hpp"
#include "receiver/receiver.hpp"

namespace ferry::control {

class PendingTensorUpdate {
 public:
  // Checks `request`'s tensors against `catalog` (names, dtypes, shapes; INVALID_ARGUMENT naming
  // the first that differs, or one staged before) and copies their bytes into buckets of at most
  // `capacity` bytes. Returns how many it staged.
  std::size_t stage(const TensorUpdateRequest& request,
                    const std::vector<ferry_tensor_desc_t>& catalog, std::uint64_t capacity);
  // Every tensor of `catalog` is staged.
  bool covers(const std::vector<ferry_tensor_desc_t>& catalog) const;
  std::size_t size() const { return names_.size(); }
  bool contains(const std::string& name) const { return names_.contains(name); }
  bool empty() const { return names_.empty(); }
  // Bytes of the staged tensors (host memory held).
  std::uint64_t bytes() const;
  // Applies what is staged as one update (label: the last weight_version given) and empties.
  receiver::UpdateReport commit(receiver::Receiver& receiver);
  void discard();
  // Discards what is staged when the last stage() is older than `timeout` at `now` (the client
  // went away between its calls); true when it did.
  bool discard_if_idle(std::chrono::steady_clock::time_point now,
                       std::chrono::milliseconds timeout);

 private:
  struct StagedBucket {
    std::vector<std::byte> data;
    std::vector<manifest::Entry> entries;
  };
  std::vector<StagedBucket> buckets_;
  std::set<std::string> names_;
  std::optional<std::string> label_;
  std::chrono::steady_clock::time_point last_staged_{};
};

}  // namespace ferry::control
