// registry/safe_memory.cpp: copies through a pipe (write(2) fails with EFAULT on an unreadable
// source instead of faulting the process) and dladdr for code pointers.
#include "registry/safe_memory.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ferry::registry {
namespace {

// Everything copied at once stays below PIPE_BUF so one write is all-or-nothing.
constexpr std::size_t kChunk = 4096;

class Pipe {
 public:
  Pipe() noexcept {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) fds_[0] = fds_[1] = -1;
  }
  ~Pipe() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    if (fds_[1] >= 0) ::close(fds_[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  bool ok() const noexcept { return fds_[0] >= 0; }

  // Copies one chunk (n <= kChunk).
  bool copy(const void* src, void* dst, std::size_t n) noexcept {
    const ssize_t wrote = ::write(fds_[1], src, n);
    if (wrote > 0) drain(static_cast<std::size_t>(wrote), dst);
    return wrote == static_cast<ssize_t>(n);
  }

 private:
  void drain(std::size_t n, void* dst) noexcept {
    auto* out = static_cast<char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fds_[0], out + got, n - got);
      if (r <= 0) return;
      got += static_cast<std::size_t>(r);
    }
  }
  int fds_[2] = {-1, -1};
};

}  // namespace

bool copy_readable(const void* src, void* dst, std::size_t n) noexcept {
  if (n == 0) return true;
  if (src == nullptr) return false;
  Pipe pipe;
  if (!pipe.ok()) return false;
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(dst);
  for (std::size_t done = 0; done < n;) {
    const std::size_t step = std::min(kChunk, n - done);
    if (!pipe.copy(from + done, to + done, step)) return false;
    done += step;
  }
  return true;
}

// AddressSanitizer checks every byte a write() reads against the object it belongs to, so a
// chunk that runs past a string's NUL (readable memory, but another object) is reported there:
// under it the string is read a byte at a time.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kByteSteps = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kByteSteps = true;
#else
constexpr bool kByteSteps = false;
#endif
#else
constexpr bool kByteSteps = false;
#endif

std::optional<std::string> read_c_string(const void* src, std::size_t max_len) {
  if (src == nullptr) return std::nullopt;
  Pipe pipe;
  if (!pipe.ok()) return std::nullopt;
  std::string text;
  auto address = reinterpret_cast<std::uintptr_t>(src);
  const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::vector<char> buffer(kChunk);
  while (text.size() <= max_len) {
    // Never read across a page boundary in one step: the next page may be unmapped even though
    // the string ends before it.
    const std::size_t step =
        kByteSteps ? 1 : std::min<std::size_t>(page - (address % page), kChunk);
    if (!pipe.copy(reinterpret_cast<const void*>(address), buffer.data(), step)) {
      return std::nullopt;
    }
    const void* nul = std::memchr(buffer.data(), '\0', step);
    if (nul != nullptr) {
      text.append(buffer.data(), static_cast<const char*>(nul) - buffer.data());
      return text.size() <= max_len ? std::optional<std::string>(text) : std::nullopt;
    }
    text.append(buffer.data(), step);
    address += step;
  }
  return std::nullopt;
}

bool inside_loaded_object(const void* address) noexcept {
  if (address == nullptr) return false;
  Dl_info info{};
  return ::dladdr(address, &info) != 0 && info.dli_fbase != nullptr;
}

}  // namespace ferry::registry
