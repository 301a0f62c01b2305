// nccl/nccl_comm.cpp: a non-blocking NCCL communicator with deadline-polled waits (see
// nccl_comm.hpp).
#include "nccl/nccl_comm.hpp"

#include <ferry/sdk/error.hpp>

#include <chrono>
#include <ctime>
#include <thread>

namespace ferry::nccl {
namespace {

// How long a healthy communicator may take to finalize before it is aborted instead. The host
// disconnects without an abort request only when every rank is leaving together
// (broadcast_group.hpp, close()), so the finalize normally completes in milliseconds.
constexpr std::int64_t kFinalizeGraceNs = 5'000'000'000;


std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return text;
}

}  // namespace

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void poll_pause(std::int64_t waiting_since_ns) {
  if (monotonic_ns() - waiting_since_ns < kSpinNs) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Communicator::Communicator(const ncclUniqueId& id, int rank, int world_size, int device,
                           std::string name, std::int64_t deadline_ns)
    : rank_(rank), world_size_(world_size), device_(device), name_(std::move(name)) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: rank {} is outside the world size {}", name_, rank,
         world_size);
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "{}: cannot use CUDA device {}: {}", where(), device_,
         cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    fail(FERRY_STATUS_INTERNAL, "{}: cudaStreamCreate failed: {}", where(), cudaGetErrorString(e));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below is ours, with a deadline
  ncclUniqueId copy = id;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size_, copy, rank_, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string text = nccl_text(r, comm_);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    fail(FERRY_STATUS_PEER_FAILED, "{}: ncclCommInitRankConfig failed (phase 'init'): {}",
         where(), text);
  }
  try {
    const std::int64_t since = monotonic_ns();
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        fail_and_abort(FERRY_STATUS_PEER_FAILED,
                       fmt::format("{}: communicator init failed (phase 'init'): {}", where(),
                                   nccl_text(state, comm_)));
      }
      if (abort_requested_.load()) check("init", 0);
      if (monotonic_ns() > deadline_ns) {
        fail_and_abort(FERRY_STATUS_TIMEOUT,
                       fmt::format("{}: communicator init did not complete before the deadline "
                                   "(phase 'init': not every rank of {} joined)",
                                   where(), world_size_));
      }
      poll_pause(since);
    }
  } catch (...) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    throw;
  }
}

Communicator::~Communicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr && !failed_ && !aborted_ && !abort_requested_.load()) {
    bool finalized = false;
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclSuccess || r == ncclInProgress) {
      const std::int64_t since = monotonic_ns();
      const std::int64_t deadline = since + kFinalizeGraceNs;
      while (monotonic_ns() < deadline) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        if (state == ncclSuccess) {
          finalized = true;
          break;
        }
        if (state != ncclInProgress) break;
        poll_pause(since);
      }
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  } else if (comm_ != nullptr && !aborted_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string Communicator::where() const {
  return fmt::format("nccl group '{}' rank {}/{}", name_, rank_, world_size_);
}

void Communicator::abort(const std::string& reason) noexcept {
  failed_ = true;
  if (aborted_ || comm_ == nullptr) return;
  (void)reason;
  cudaSetDevice(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = true;
}

void Communicator::request_abort(const std::string& reason) noexcept {
  try {
    std::lock_guard lock(reason_mutex_);
    abort_reason_ = reason;
  } catch (...) {
    // The flag below still stops the waits; only the message loses the reason.
  }
  abort_requested_.store(true);
}

void Communicator::fail_and_abort(int code, const std::string& message) {
  abort(message);
  throw Error(static_cast<ferry_status_code_t>(code), message + "; communicator aborted");
}

void Communicator::check(const char* phase, std::uint32_t bucket_index) {
  if (abort_requested_.load()) {
    std::string reason;
    {
      std::lock_guard lock(reason_mutex_);
      reason = abort_reason_;
    }
    fail_and_abort(FERRY_STATUS_ABORTED,
                   fmt::format("{}: aborted on request during phase '{}' (bucket {}): {}",
                               where(), phase, bucket_index, reason));
  }
  if (aborted_ || comm_ == nullptr) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "{}: the communicator was aborted earlier", where());
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) state = r;
  if (state != ncclSuccess && state != ncclInProgress) {
    fail_and_abort(FERRY_STATUS_PEER_FAILED,
                   fmt::format("{}: NCCL reported an error during phase '{}' (bucket {}): {}",
                               where(), phase, bucket_index, nccl_text(state, comm_)));
  }
}

void Communicator::broadcast(void* data, std::uint64_t bytes, std::uint32_t bucket_index,
                             cudaEvent_t done, std::int64_t deadline_ns) {
  check("broadcast", bucket_index);
  cudaSetDevice(device_);
  const ncclResult_t r =
      ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, 0, comm_, stream_);
  if (r != ncclSuccess && r != ncclInProgress) {
    fail_and_abort(FERRY_STATUS_PEER_FAILED,
                   fmt::format("{}: ncclBroadcast of bucket {} ({} bytes) failed: {}", where(),
                               bucket_index, bytes, nccl_text(r, comm_)));
  }
  // A non-blocking communicator may still be enqueueing: wait until it accepted the call.
  const std::int64_t since = monotonic_ns();
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) check("broadcast", bucket_index);
    if (abort_requested_.load()) check("broadcast", bucket_index);
    if (deadline_ns > 0 && monotonic_ns() > deadline_ns) {
      fail_and_abort(FERRY_STATUS_TIMEOUT,
                     fmt::format("{}: enqueueing the broadcast of bucket {} did not finish "
                                 "before the deadline (phase 'broadcast')",
                                 where(), bucket_index));
    }
    poll_pause(since);
  }
  if (cudaError_t e = cudaEventRecord(done, stream_); e != cudaSuccess) {
    fail_and_abort(FERRY_STATUS_INTERNAL, fmt::format("{}: cudaEventRecord failed: {}", where(),
                                                      cudaGetErrorString(e)));
  }
}

bool Communicator::test(cudaEvent_t done, std::uint32_t bucket_index,
                        std::int64_t hard_deadline_ns) {
  cudaSetDevice(device_);
  const cudaError_t e = cudaEventQuery(done);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) {
    fail_and_abort(FERRY_STATUS_INTERNAL,
                   fmt::format("{}: the broadcast of bucket {} failed on the device: {}", where(),
                               bucket_index, cudaGetErrorString(e)));
  }
  check("broadcast", bucket_index);
  if (hard_deadline_ns > 0 && monotonic_ns() > hard_deadline_ns) {
    fail_and_abort(FERRY_STATUS_TIMEOUT,
                   fmt::format("{}: the broadcast of bucket {} did not complete before its "
                               "deadline (phase 'broadcast'; a peer stopped taking part)",
                               where(), bucket_index));
  }
  return false;
}

}  // namespace ferry::nccl
