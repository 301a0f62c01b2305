// plugins/ucx/split_copy.hpp: a memcpy of a large put shared by the calling thread and one helper
// thread, for puts that are a copy into a peer's memory mapped here (ucx_transport.cpp): one core
// copying 1 MiB between two processes' memory reaches ~13 GB/s here, below what UCX's own
// tagged rendezvous (a kernel cma copy) reaches at that size; two cores copy halves.
//
// Threading: copy() is called by one thread at a time (the transport's mutex is held); the helper
// thread touches nothing but the half it is handed. The helper spins briefly after each half (the
// next bucket's put usually follows within microseconds), then sleeps until the next one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace ferry::ucx {

class SplitCopy {
 public:
  // Copies below this many bytes are done by the caller alone (a handoff costs microseconds).
  static constexpr std::size_t kSplitBytes = 256 * 1024;

  SplitCopy() = default;
  ~SplitCopy();
  SplitCopy(const SplitCopy&) = delete;
  SplitCopy& operator=(const SplitCopy&) = delete;

  // memcpy(dst, src, n), the second half by the helper when n >= kSplitBytes.
  void copy(void* dst, const void* src, std::size_t n);

 private:
  void helper_loop();

  std::thread helper_;             // started on the first split copy
  std::mutex mutex_;               // guards sleeping_ and stop_ with wake_
  std::condition_variable wake_;
  bool sleeping_ = false;
  bool stop_ = false;
  // The half handed over: written before `posted_` is raised (release), read after (acquire).
  void* dst_ = nullptr;
  const void* src_ = nullptr;
  std::size_t n_ = 0;
  std::atomic<std::uint64_t> posted_{0};    // halves handed over
  std::atomic<std::uint64_t> finished_{0};  // halves copied
};

}  // namespace ferry::ucx
