// Plain TCP sockets for the control API's hostile-client tests (see raw_http.hpp).
#include "raw_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace ferry::test {

using Clock = std::chrono::steady_clock;

RawConnection::RawConnection(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int connected = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (connected != 0 && errno == EINTR) {
    // A signal (a fuzzer's timer) interrupted it; the connection goes on: wait for its outcome.
    pollfd p{fd_, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof error;
    while ((connected = ::poll(&p, 1, 5000)) < 0 && errno == EINTR) {
    }
    if (connected > 0 && ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len) == 0) {
      errno = error;
      connected = error == 0 ? 0 : -1;
    } else {
      errno = connected == 0 ? ETIMEDOUT : errno;
      connected = -1;
    }
  }
  if (connected != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + ": " + why);
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

RawConnection::~RawConnection() {
  if (fd_ >= 0) ::close(fd_);
}

RawConnection::RawConnection(RawConnection&& other) noexcept
    : partial(std::move(other.partial)), fd_(other.fd_) {
  other.fd_ = -1;
}

bool RawConnection::send(const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

namespace {
// Reads what is available within the deadline into `out`; false at the peer's end.
bool read_some(int fd, Clock::time_point deadline, std::string& out) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count()))) <= 0) return true;
  char buf[65536];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n < 0 && errno == EINTR) return true;  // interrupted by a signal: read again
  if (n <= 0) return false;
  out.append(buf, static_cast<std::size_t>(n));
  return true;
}

std::optional<std::size_t> answer_end(const std::string& text) {
  const auto head_end = text.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  std::size_t length = 0;
  std::string head = text.substr(0, head_end);
  for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (auto at = head.find("content-length:"); at != std::string::npos) {
    length = std::stoul(head.substr(at + 15));
  }
  if (text.size() < head_end + 4 + length) return std::nullopt;
  return head_end + 4 + length;
}
}  // namespace

std::optional<std::string> RawConnection::read_until_closed(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (!read_some(fd_, deadline, partial)) return std::move(partial);
  }
  return std::nullopt;
}

std::optional<std::string> RawConnection::read_answer(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto end = answer_end(partial)) {
      std::string answer = partial.substr(0, *end);
      partial.erase(0, *end);
      return answer;
    }
    if (Clock::now() >= deadline || !read_some(fd_, deadline, partial)) {
      if (auto end = answer_end(partial)) continue;
      return std::nullopt;
    }
  }
}

RawAnswer parse_answer(const std::string& text) {
  RawAnswer a;
  const auto head_end = text.find("\r\n\r\n");
  a.head = text.substr(0, head_end);
  if (text.rfind("HTTP/1.", 0) == 0 && text.size() > 12) a.status = std::stoi(text.substr(9, 3));
  if (head_end != std::string::npos) {
    a.body = nlohmann::json::parse(text.substr(head_end + 4), nullptr, false);
    if (a.body.is_discarded()) a.body = nullptr;
  }
  return a;
}

std::uint64_t raise_own_file_limit() {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

std::uint64_t proc_status_value(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  throw std::runtime_error("/proc/" + std::to_string(pid) + "/status has no " + field);
}

}  // namespace ferry::test
