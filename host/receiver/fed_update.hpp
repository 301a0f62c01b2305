// receiver/fed_update.hpp: one update whose buckets its caller hands over one at a time, as they
// come (SGLang's /update_weights_from_tensor: a model in several calls, each bucket read straight
// from the trainer's memory while its call runs). A thread of its own holds the receiver's update
// lock from the start to the end and runs the update loop over a source the caller feeds:
// apply() returns once the bucket was applied (its memory may go), finish() commits, abort()
// (or the destructor, or no bucket for `idle_timeout`) aborts; the update engine then restores
// the last committed weights from the host mirror or fences, as for any update, and the
// published version stays. Health says "updating" from the start to the end.
//
// Threading: one caller at a time (the owner serializes); the update runs on the object's thread.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "receiver/receiver.hpp"
#include "update/bucket_source.hpp"

namespace ferry::receiver {

class FedUpdate {
 public:
  // Takes the update lock and checks `catalog` as a session's handshake does
  // (Receiver::open_session: FAILED_PRECONDITION when another update runs, INCOMPATIBLE...);
  // the update is the published version + 1. `catalog` must outlive the object.
  FedUpdate(Receiver& receiver, std::span<const ferry_tensor_desc_t> catalog,
            std::chrono::milliseconds idle_timeout);
  ~FedUpdate();
  FedUpdate(const FedUpdate&) = delete;
  FedUpdate& operator=(const FedUpdate&) = delete;

  std::uint64_t version() const noexcept { return version_; }
  // Applies `bucket` (its manifest's version 0 or version()); returns once it was applied.
  // Throws the update's error when it failed (the update is then over).
  void apply(update::Bucket bucket);
  // Ends the update and commits it (label: the published weight_version; default the number).
  UpdateReport finish(const std::optional<std::string>& label);
  // Ends the update without committing (`reason` in the log and the fence); never throws.
  void abort(const std::string& reason) noexcept;
  // True once the update ended (committed, aborted or failed).
  bool over() const;

 private:
  struct Shared;
  class Source;
  void wait_over();
  std::shared_ptr<Shared> s_;
  std::thread thread_;
  std::uint64_t version_ = 0;
};

}  // namespace ferry::receiver
