// kernels/cpu/threads.cpp: the hardware's thread count, read once per process (cpu.hpp).
#include <algorithm>
#include <thread>

#include "ferry/kernels/cpu.hpp"

namespace ferry::kernels {

unsigned hardware_threads() noexcept {
  // std::thread::hardware_concurrency opens and reads /sys/devices/system/cpu/online on every
  // call (glibc): ~3 us, once per tensor fingerprinted or scattered on the host.
  static const unsigned count = std::max(1u, std::thread::hardware_concurrency());
  return count;
}

}  // namespace ferry::kernels
