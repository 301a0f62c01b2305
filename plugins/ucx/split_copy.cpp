// plugins/ucx/split_copy.cpp: SplitCopy (split_copy.hpp): the caller copies the first half while
// the helper copies the second; the caller returns once both are done.
#include "split_copy.hpp"

#include <chrono>
#include <cstring>

namespace ferry::ucx {
namespace {

// How long the helper keeps polling for the next half before it sleeps.
constexpr auto kHelperSpin = std::chrono::microseconds(200);

}  // namespace

SplitCopy::~SplitCopy() {
  if (!helper_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  helper_.join();
}

void SplitCopy::copy(void* dst, const void* src, std::size_t n) {
  if (n < kSplitBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  if (!helper_.joinable()) helper_ = std::thread([this] { helper_loop(); });
  // Halves on a 4 KiB boundary, so neither thread shares a page (or a cache line) with the other.
  const std::size_t first = (n / 2) & ~static_cast<std::size_t>(4095);
  dst_ = static_cast<std::uint8_t*>(dst) + first;
  src_ = static_cast<const std::uint8_t*>(src) + first;
  n_ = n - first;
  const std::uint64_t ticket = posted_.fetch_add(1, std::memory_order_release) + 1;
  {
    std::lock_guard lock(mutex_);
    if (sleeping_) wake_.notify_one();
  }
  std::memcpy(dst, src, first);
  while (finished_.load(std::memory_order_acquire) < ticket) std::this_thread::yield();
}

void SplitCopy::helper_loop() {
  std::uint64_t done = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kHelperSpin;
    while (posted_.load(std::memory_order_acquire) == done &&
           std::chrono::steady_clock::now() < spin_until) {
    }
    if (posted_.load(std::memory_order_acquire) == done) {
      std::unique_lock lock(mutex_);
      sleeping_ = true;
      wake_.wait(lock, [&] { return stop_ || posted_.load(std::memory_order_acquire) != done; });
      sleeping_ = false;
      if (stop_) return;
    }
    std::memcpy(dst_, src_, n_);
    ++done;
    finished_.store(done, std::memory_order_release);
  }
}

}  // namespace ferry::ucx
