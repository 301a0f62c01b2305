// registry/child_process.cpp: poll(2) over the children's pipes with one deadline, then SIGKILL
// and waitpid (see child_process.hpp).
#include "registry/child_process.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace ferry::registry {
namespace {

constexpr std::size_t kTailBytes = 400;

// Appends what is available on `fd`; false at end of file or on an error.
bool drain(int fd, std::string* into, bool keep_tail_only) {
  char buffer[4096];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  into->append(buffer, static_cast<std::size_t>(n));
  if (keep_tail_only && into->size() > 4 * kTailBytes) into->erase(0, into->size() - kTailBytes);
  return true;
}

}  // namespace

std::string signal_description(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  const char* text = ::strsignal(signal);
  if (abbrev == nullptr) return fmt::format("signal {}", signal);
  return fmt::format("SIG{} ({})", abbrev, text != nullptr ? text : "?");
}

std::vector<ChildEnd> await_children(const std::vector<Child>& children,
                                     std::chrono::steady_clock::time_point deadline) {
  std::vector<ChildEnd> ends(children.size());
  // Open fds: (child index, is the report pipe).
  std::vector<pollfd> fds;
  std::vector<std::pair<std::size_t, bool>> owners;
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (children[i].report_fd >= 0) {
      fds.push_back({children[i].report_fd, POLLIN, 0});
      owners.emplace_back(i, true);
    }
    if (children[i].output_fd >= 0) {
      fds.push_back({children[i].output_fd, POLLIN, 0});
      owners.emplace_back(i, false);
    }
  }
  while (!fds.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // timeout: the loop condition ends it
    for (std::size_t k = fds.size(); k-- > 0;) {
      if (fds[k].revents == 0) continue;
      auto [index, is_report] = owners[k];
      ChildEnd& end = ends[index];
      if (!drain(fds[k].fd, is_report ? &end.report : &end.output_tail, !is_report)) {
        ::close(fds[k].fd);
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(k));
        owners.erase(owners.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  // Pipes still open at the deadline: their children are still running (or left a grandchild
  // holding the pipe); both count as not finished in time.
  for (std::size_t k = 0; k < fds.size(); ++k) {
    ends[owners[k].first].timed_out = true;
    ::close(fds[k].fd);
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    ChildEnd& end = ends[i];
    int status = 0;
    pid_t got = 0;
    // A child that closed its pipes may still be running: it gets until the deadline too.
    while (!end.timed_out) {
      got = ::waitpid(children[i].pid, &status, WNOHANG);
      if (got != 0 && !(got < 0 && errno == EINTR)) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        end.timed_out = true;
        break;
      }
      ::usleep(1000);
    }
    if (end.timed_out) {
      ::kill(children[i].pid, SIGKILL);
      do {
        got = ::waitpid(children[i].pid, &status, 0);
      } while (got < 0 && errno == EINTR);
    } else if (got == children[i].pid) {
      if (WIFEXITED(status)) {
        end.exited = true;
        end.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        end.signal = WTERMSIG(status);
      }
    }
    if (end.output_tail.size() > kTailBytes) {
      end.output_tail.erase(0, end.output_tail.size() - kTailBytes);
    }
  }
  return ends;
}

std::string last_line_with(const std::string& report, const std::string& prefix) {
  std::string found;
  std::size_t start = 0;
  while (start < report.size()) {
    auto end = report.find('\n', start);
    if (end == std::string::npos) end = report.size();
    if (report.compare(start, prefix.size(), prefix) == 0) {
      found = report.substr(start + prefix.size(), end - start - prefix.size());
    }
    start = end + 1;
  }
  return found;
}

}  // namespace ferry::registry
