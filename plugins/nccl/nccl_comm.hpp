// nccl/nccl_comm.hpp: one non-blocking NCCL communicator of a weight-update group and the
// broadcasts issued on it. Every wait polls ncclCommGetAsyncError against a deadline; on an error,
// a hard deadline or an abort request the communicator is aborted (ncclCommAbort) and the error
// names the group, the rank, the phase and the bucket.
//
// Threading: every method except request_abort() is called by one thread at a time (the
// plugin's "serialized" contract). request_abort() may be called from any thread: it only sets
// a flag; the thread that polls next aborts the communicator (ncclCommAbort must not race with
// other calls on the same communicator).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace ferry::nccl {

// CLOCK_MONOTONIC nanoseconds (the ABI's deadline clock).
std::int64_t monotonic_ns();

// One pause of a polling loop that started waiting at `waiting_since_ns`: a yield during the
// first kSpinNs (a bucket of tens of MiB completes in a few hundred microseconds, and a sleep
// rounds up to the kernel's timer slack, ~50-80 us: that alone cost 0.1 ms per 64 MiB bucket),
// a 20 us sleep after that (long waits do not burn a core).
inline constexpr std::int64_t kSpinNs = 2'000'000;
void poll_pause(std::int64_t waiting_since_ns);

class Communicator {
 public:
  // Creates the communicator of rank `rank` of `world_size` on CUDA device `device` and waits,
  // polling, until NCCL finished initialising or `deadline_ns` passed. `name` is used in
  // messages ("group 'g' rank 1/2"). TIMEOUT (phase 'init') or PEER_FAILED naming NCCL's error;
  // the communicator is aborted before the error is thrown.
  Communicator(const ncclUniqueId& id, int rank, int world_size, int device, std::string name,
               std::int64_t deadline_ns);
  // Finalizes and destroys a healthy communicator (bounded by a grace period, then aborts);
  // aborts a failed one.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Enqueues a broadcast from rank 0 of `bytes` bytes at `data` (device memory; in place on every
  // rank) on the communicator's stream and records `done` after it. Waits (polling) until NCCL
  // accepted the call. Errors as the constructor's, phase 'broadcast bucket <index>'.
  void broadcast(void* data, std::uint64_t bytes, std::uint32_t bucket_index, cudaEvent_t done,
                 std::int64_t deadline_ns);

  // Polls once: true when `done` completed; throws (and aborts) when NCCL reported an error, the
  // abort flag is set or `hard_deadline_ns` (> 0) passed.
  bool test(cudaEvent_t done, std::uint32_t bucket_index, std::int64_t hard_deadline_ns);

  // Aborts now (same thread as the other calls). Idempotent.
  void abort(const std::string& reason) noexcept;
  // Any thread: asks the polling thread to abort with `reason`.
  void request_abort(const std::string& reason) noexcept;

  bool failed() const { return failed_; }
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  // Throws (after aborting) when NCCL reported an asynchronous error or an abort was requested.
  void check(const char* phase, std::uint32_t bucket_index);
  [[noreturn]] void fail_and_abort(int code, const std::string& message);
  std::string where() const;

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int world_size_ = 0;
  int device_ = 0;
  std::string name_;
  bool failed_ = false;
  bool aborted_ = false;
  std::atomic<bool> abort_requested_{false};
  std::mutex reason_mutex_;
  std::string abort_reason_;  // guarded by reason_mutex_
};

}  // namespace ferry::nccl
