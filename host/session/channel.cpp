// Frames over a stream socket with deadlines (see session/channel.hpp).
#include "session/channel.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <ferry/sdk/error.hpp>
#include <kj/exception.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ferry::session {
namespace {

constexpr std::uint32_t kMagic = 0x31595246;  // "FRY1" little-endian
constexpr std::size_t kHeaderBytes = 16;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  // Wake up at least every 200 ms so shutdown() is noticed even if poll missed it.
  return static_cast<int>(std::min<std::int64_t>(left.count() + 1, 200));
}

std::string errno_text(int err) { return std::strerror(err); }

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

const char* kind_name(std::uint32_t kind) {
  switch (kind) {
    case 1: return "message";
    case 2: return "data";
    default: return "unknown";
  }
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

Received::Received(kj::Array<capnp::word> words) : words_(std::move(words)) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kMaxMessageBytes / sizeof(capnp::word) * 2;
  options.nestingLimit = 16;
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), options);
  root_ = reader_->getRoot<wire::Message>();
}

kj::Array<capnp::word> flatten(capnp::MessageBuilder& message) {
  return capnp::messageToFlatArray(message);
}

Channel::Channel(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
  set_nonblocking(fd_);
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

void Channel::shutdown() noexcept {
  shut_.store(true);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool Channel::is_shut_down() const noexcept { return shut_.load(); }

void Channel::write_all(const void* data, std::size_t size, Clock::time_point deadline,
                        const std::string& phase) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    if (shut_.load()) fail(FERRY_STATUS_ABORTED, "{}: {}: the session was aborted", peer_, phase);
    const ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int wait = remaining_ms(deadline);
      if (wait == 0) {
        fail(FERRY_STATUS_TIMEOUT, "{}: {}: the peer took nothing before the deadline", peer_,
             phase);
      }
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, wait);
      continue;
    }
    if (shut_.load()) fail(FERRY_STATUS_ABORTED, "{}: {}: the session was aborted", peer_, phase);
    fail(FERRY_STATUS_PEER_FAILED, "{}: {}: connection lost ({})", peer_, phase,
         errno_text(errno));
  }
}

void Channel::read_all(void* data, std::size_t size, Clock::time_point deadline,
                       const std::string& phase, bool at_frame_start,
                       Clock::time_point spin_until) {
  auto* p = static_cast<std::uint8_t*>(data);
  std::size_t got = 0;
  while (got < size) {
    if (shut_.load()) fail(FERRY_STATUS_ABORTED, "{}: {}: the session was aborted", peer_, phase);
    const ssize_t n = ::recv(fd_, p + got, size - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      if (shut_.load()) fail(FERRY_STATUS_ABORTED, "{}: {}: the session was aborted", peer_, phase);
      fail(FERRY_STATUS_PEER_FAILED, "{}: {}: the peer closed the connection{}", peer_, phase,
           at_frame_start && got == 0 ? "" : " in the middle of a frame");
    }
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && Clock::now() < spin_until) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int wait = remaining_ms(deadline);
      if (wait == 0) {
        fail(FERRY_STATUS_TIMEOUT, "{}: {}: no answer before the deadline", peer_, phase);
      }
      pollfd pfd{fd_, POLLIN, 0};
      ::poll(&pfd, 1, wait);
      continue;
    }
    if (shut_.load()) fail(FERRY_STATUS_ABORTED, "{}: {}: the session was aborted", peer_, phase);
    fail(FERRY_STATUS_PEER_FAILED, "{}: {}: connection lost ({})", peer_, phase,
         errno_text(errno));
  }
}

void Channel::write_header(FrameKind kind, std::uint64_t length, Clock::time_point deadline,
                           const std::string& phase) {
  std::uint8_t header[kHeaderBytes];
  put_u32(header, kMagic);
  put_u32(header + 4, static_cast<std::uint32_t>(kind));
  put_u64(header + 8, length);
  write_all(header, sizeof header, deadline, phase);
}

std::uint64_t Channel::read_header(FrameKind expected, Clock::time_point deadline,
                                   const std::string& phase, Clock::time_point spin_until) {
  std::uint8_t header[kHeaderBytes];
  read_all(header, sizeof header, deadline, phase, true, spin_until);
  if (get_u32(header) != kMagic) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: {}: not a ferry session frame (bad magic 0x{:08x}; is this a ferry sender?)", peer_,
         phase, get_u32(header));
  }
  const std::uint32_t kind = get_u32(header + 4);
  const std::uint64_t length = get_u64(header + 8);
  if (kind != static_cast<std::uint32_t>(expected)) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: expected a {} frame, got a {} frame (kind {})", peer_,
         phase, kind_name(static_cast<std::uint32_t>(expected)), kind_name(kind), kind);
  }
  return length;
}

void Channel::send(capnp::MessageBuilder& message, Clock::time_point deadline,
                   const std::string& phase) {
  auto words = flatten(message);
  auto bytes = words.asBytes();
  std::lock_guard lock(send_mutex_);
  write_header(FrameKind::Message, bytes.size(), deadline, phase);
  write_all(bytes.begin(), bytes.size(), deadline, phase);
}

void Channel::send_data(std::span<const std::byte> bytes, Clock::time_point deadline,
                        const std::string& phase) {
  std::lock_guard lock(send_mutex_);
  write_header(FrameKind::Data, bytes.size(), deadline, phase);
  write_all(bytes.data(), bytes.size(), deadline, phase);
}

std::unique_ptr<Received> Channel::recv(Clock::time_point deadline, const std::string& phase,
                                        std::chrono::microseconds spin) {
  const auto spin_until = spin.count() > 0 ? std::min(Clock::now() + spin, deadline)
                                           : Clock::time_point{};
  const std::uint64_t length = read_header(FrameKind::Message, deadline, phase, spin_until);
  if (length == 0 || length > kMaxMessageBytes || length % sizeof(capnp::word) != 0) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: {}: message frame of {} bytes refused (must be a positive multiple of 8, at most {})",
         peer_, phase, length, kMaxMessageBytes);
  }
  auto words = kj::heapArray<capnp::word>(length / sizeof(capnp::word));
  read_all(words.begin(), length, deadline, phase, false);
  try {
    return std::make_unique<Received>(std::move(words));
  } catch (const kj::Exception& e) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: not a valid session message ({})", peer_, phase,
         e.getDescription().cStr());
  }
}

void Channel::recv_data(std::span<std::byte> dst, Clock::time_point deadline,
                        const std::string& phase) {
  const std::uint64_t length = read_header(FrameKind::Data, deadline, phase);
  if (length != dst.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: data frame of {} bytes, but {} were announced", peer_,
         phase, length, dst.size());
  }
  read_all(dst.data(), dst.size(), deadline, phase, false);
}

// ---- sockets -------------------------------------------------------------------------------

namespace {

int wait_connected(int fd, Clock::time_point deadline, const std::string& what) {
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      ::close(fd);
      fail(FERRY_STATUS_TIMEOUT, "{}: connect: no answer before the deadline", what);
    }
    pollfd pfd{fd, POLLOUT, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left, 200)));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd);
      fail(FERRY_STATUS_IO, "{}: connect: {}", what, errno_text(err));
    }
    return fd;
  }
}

}  // namespace

int connect_tcp(const std::string& host, int port, Clock::time_point deadline,
                const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    fail(FERRY_STATUS_IO, "{}: cannot resolve '{}': {}", what, host, gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    set_nonblocking(fd);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
      try {
        const int connected = wait_connected(fd, deadline, what);
        ::freeaddrinfo(result);
        return connected;
      } catch (const Error& e) {
        if (e.code() == FERRY_STATUS_TIMEOUT) {
          ::freeaddrinfo(result);
          throw;
        }
        last_error = e.what();
        continue;
      }
    }
    last_error = fmt::format("{}: connect: {}", what, errno_text(errno));
    ::close(fd);
  }
  ::freeaddrinfo(result);
  fail(FERRY_STATUS_IO, "{}", last_error);
}

int connect_unix(const std::string& path, Clock::time_point deadline, const std::string& what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: Unix socket path '{}' is too long", what, path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(FERRY_STATUS_IO, "{}: socket: {}", what, errno_text(errno));
  set_nonblocking(fd);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 || errno == EINPROGRESS ||
      errno == EAGAIN) {
    return wait_connected(fd, deadline, what);
  }
  const int err = errno;
  ::close(fd);
  fail(FERRY_STATUS_IO, "{}: connect to '{}': {}", what, path, errno_text(err));
}

void Listener::close() noexcept {
  if (fd >= 0) {
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    fd = -1;
  }
  if (!unix_path.empty()) {
    ::unlink(unix_path.c_str());
    unix_path.clear();
  }
}

Listener listen_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    fail(FERRY_STATUS_IO, "session listener: cannot resolve '{}': {}", host, gai_strerror(rc));
  }
  const int fd = ::socket(result->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(result);
    fail(FERRY_STATUS_IO, "session listener: socket: {}", errno_text(errno));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, result->ai_addr, result->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::freeaddrinfo(result);
    ::close(fd);
    fail(FERRY_STATUS_IO, "session listener: cannot listen on {}:{}: {}", host, port,
         errno_text(err));
  }
  ::freeaddrinfo(result);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  Listener l;
  l.fd = fd;
  l.port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return l;
}

Listener listen_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "session listener: Unix socket path '{}' is too long", path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(FERRY_STATUS_IO, "session listener: socket: {}", errno_text(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    fail(FERRY_STATUS_IO, "session listener: cannot listen on '{}': {}", path, errno_text(err));
  }
  Listener l;
  l.fd = fd;
  l.unix_path = path;
  return l;
}

int accept_connection(std::span<const Listener* const> listeners,
                      std::chrono::milliseconds timeout, std::string& peer) {
  std::vector<pollfd> pfds;
  std::vector<const Listener*> polled;
  for (const Listener* l : listeners) {
    if (l == nullptr || l->fd < 0) continue;
    pfds.push_back({l->fd, POLLIN, 0});
    polled.push_back(l);
  }
  if (pfds.empty()) return -1;
  const int r = ::poll(pfds.data(), pfds.size(), static_cast<int>(timeout.count()));
  if (r <= 0) return -1;
  const Listener* ready = nullptr;
  for (std::size_t i = 0; i < pfds.size() && ready == nullptr; ++i) {
    if (pfds[i].revents & POLLIN) ready = polled[i];
  }
  if (ready == nullptr) return -1;
  const Listener& listener = *ready;
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int fd = ::accept4(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
  if (fd < 0) return -1;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    peer = fmt::format("{}:{}", host, port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    peer = fmt::format("[{}]:{}", host, port);
  } else {
    peer = "unix:" + listener.unix_path;
  }
  const int one = 1;
  if (addr.ss_family != AF_UNIX) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace ferry::session
