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
  if (state == 'Z' || state == 'X') return true;
  // A process being killed closes its files before it is a zombie: its kernel flags (field 9,
  // the sixth after the state) say PF_EXITING from the start of its exit.
  std::string_view rest = stat.substr(close + 2);
  for (int field = 0; field < 6; ++field) {
    const auto space = rest.find(' ');
    if (space == std::string_view::npos) return false;
    rest.remove_prefix(space + 1);
  }
  unsigned long flags = 0;
  for (const char c : rest) {
    if (c < '0' || c > '9') break;
    flags = flags * 10 + static_cast<unsigned long>(c - '0');
  }
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING (include/linux/sched.h)
  return (flags & kExiting) != 0;
}

}  // namespace ferry::ucx
