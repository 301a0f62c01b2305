// plugins/ucx/process_state.cpp: process_gone (process_state.hpp) with plain open/read. A
// std::ifstream here once threw out of the progress thread (std::terminate): libstdc++'s filebuf
// throws when read(2) fails, and read fails with ESRCH when the process is reaped after the open.
#include "process_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string_view>

namespace ferry::ucx {

bool process_gone(std::uint32_t pid) noexcept {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  // "pid (comm) S ...": comm is at most 16 bytes but may hold ')' and spaces, so read enough to
  // find the last ')' and the state after it.
  char buf[512];
  std::size_t have = 0;
  while (have < sizeof buf) {
    const ssize_t r = ::read(fd, buf + have, sizeof buf - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += static_cast<std::size_t>(r);
  }
  ::close(fd);
  const std::string_view stat(buf, have);
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size()) return true;
  const char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace ferry::ucx
