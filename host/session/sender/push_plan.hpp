// session/sender/push_plan.hpp: what one push sends, planned once for every receiver: the
// checks of the tensors, their packing into buckets (sdk/bucket_packing.hpp), and each bucket's
// fingerprints and manifest, computed on a thread of their own while the sessions set up.
//
// Threading: a plan is built on push()'s thread and then only read by the session threads;
// its fingerprints and manifests only after wait_sealed().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "session/sender/sender.hpp"

namespace ferry::session {

struct PlannedBucket {
  std::vector<std::pair<std::size_t, std::uint64_t>> items;  // tensor index, offset in bucket
  std::uint64_t bytes = 0;
  std::vector<std::uint8_t> manifest;
  std::vector<std::uint64_t> fingerprints;  // per item
  bool cuda = true;  // every item is in CUDA memory (a device transport may put it in place)
};

// How far a PlanSealing got: buckets [0, sealed) have their fingerprints and manifests.
struct SealProgress {
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t sealed = 0;
  std::exception_ptr error;  // the fingerprinting's failure: no bucket from `sealed` on comes
};

struct PushPlan {
  // Fingerprints and manifests are computed while the sessions set up (handshake, connect,
  // first copies), once, by the first session that needs them (seal(); a session whose copies
  // fingerprint what they write needs none), bucket by bucket: bucket k's `fingerprints` and
  // `manifest` may be read only after wait_sealed(k), which rethrows the fingerprinting's failure
  // when it came before bucket k was sealed. Bucket 0 is announced while the others' are made.
  std::function<void()> seal;  // starts the work unless started; any thread
  // Waits, once, for the work that produces the tensors (order::Pending): nothing reads a
  // tensor's bytes (fingerprints, gathering, packing, launching copies, a receiver told where
  // to read) before it returned. Any thread; empty: nothing to wait for.
  std::function<void()> before_reads;
  void await_producers() const {
    if (before_reads) before_reads();
  }
  std::shared_ptr<SealProgress> sealing;
  // Starts the work (seal()) and waits for bucket k (every bucket by default).
  void wait_sealed(std::size_t k = SIZE_MAX) const;
  std::vector<PlannedBucket> buckets;
  std::uint64_t capacity = 0;
  std::uint64_t total = 0;
  std::uint64_t bucket_total = 0;  // the buckets' bytes (alignment padding included)
  bool cuda_tensors = false;  // every tensor is in CUDA memory
  int device = -1;            // the GPU of the first CUDA tensor; -1: none
  std::vector<std::uint64_t> sizes;  // bytes of each tensor of the push
};

// What push() checks of its tensors before anything is read: each has a name (unique, unless
// `names_known_unique`: they are a kept session's catalog, checked at its first push), a dtype,
// at most FERRY_MAX_DIMS dims, a size that fits, data unless empty, and a known memory kind
// (CUDA only in a CUDA build). Throws INVALID_ARGUMENT (UNIMPLEMENTED for CUDA memory without
// CUDA) naming the tensor.
struct CheckedTensors {
  std::vector<std::uint64_t> sizes;  // bytes of each tensor
  std::uint64_t largest = 0;
  std::uint64_t total = 0;
};
CheckedTensors check_tensors(std::span<const TensorView> tensors, bool names_known_unique);

// The buckets: of at most `bucket_bytes` bytes (one tensor alone may be larger: the capacity
// grows to hold it), never larger than the aligned total; one empty bucket when nothing is to
// be sent. `seal` and `sealed` are left to a PlanSealing.
PushPlan plan_buckets(std::span<const TensorView> tensors, CheckedTensors checked,
                      std::uint64_t bucket_bytes);

// The manifest of bucket `k`: its tensors at their offsets in the bucket, with `prints` (one
// per tensor of the push) as their fingerprints; none when `prints` is empty.
std::vector<std::uint8_t> bucket_manifest(const PushPlan& plan, std::uint32_t k,
                                          std::span<const TensorView> tensors,
                                          std::uint64_t version, const std::string& label,
                                          std::span<const std::uint64_t> prints);

// Computes `plan`'s fingerprints and manifests on a thread of its own, started by the first
// plan.seal(). Declare it after the plan and the tensors it reads: its destructor joins that
// thread.
class PlanSealing {
 public:
  PlanSealing(PushPlan& plan, std::span<const TensorView> tensors, std::uint64_t version,
              std::string label, unsigned threads);
  ~PlanSealing();
  PlanSealing(const PlanSealing&) = delete;
  PlanSealing& operator=(const PlanSealing&) = delete;

  // Waits for the work when it was started; rethrows its failure.
  void wait();
  // How long the fingerprints and manifests took (0 unless they were all made; read it after
  // wait()).
  double seconds() const { return seconds_; }

 private:
  void run();

  PushPlan& plan_;
  std::span<const TensorView> tensors_;
  std::uint64_t version_;
  std::string label_;
  unsigned threads_;
  std::thread thread_;
  std::once_flag once_;
  std::atomic<bool> started_{false};
  double seconds_ = 0;
};

}  // namespace ferry::session
