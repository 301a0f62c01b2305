// group/rendezvous.cpp: the TCP rendezvous of a weight-update group (see rendezvous.hpp).
#include "group/rendezvous.hpp"

#include <ferry/sdk/error.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace ferry::nccl {
namespace {

constexpr std::uint8_t kMagic[4] = {'F', 'R', 'D', 'V'};
constexpr std::size_t kHeaderBytes = 12;
constexpr std::uint32_t kMaxHelloBytes = 4 + 4 + 2 + kMaxGroupNameBytes;
// A joiner gets this long to send its HELLO, so a silent or slow client cannot hold rank 0.
constexpr auto kHelloGrace = std::chrono::seconds(5);

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left.count(), 1'000'000));
}

std::string errno_text(int err) { return std::strerror(err); }

void put_u16(std::vector<std::uint8_t>& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}
void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint16_t get_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

enum class IoResult { ok, closed, timeout, error };

IoResult read_exact(int fd, std::uint8_t* data, std::size_t n, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return IoResult::error;
    }
    if (ready == 0) return IoResult::timeout;
    const ssize_t r = ::recv(fd, data + got, n - got, 0);
    if (r == 0) return IoResult::closed;
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno == ECONNRESET ? IoResult::closed : IoResult::error;
    }
    got += static_cast<std::size_t>(r);
  }
  return IoResult::ok;
}

IoResult write_all(int fd, const std::vector<std::uint8_t>& bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return IoResult::error;
    }
    if (ready == 0) return IoResult::timeout;
    const ssize_t w = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno == EPIPE || errno == ECONNRESET ? IoResult::closed : IoResult::error;
    }
    sent += static_cast<std::size_t>(w);
  }
  return IoResult::ok;
}

struct Frame {
  enum class Status { ok, closed, timeout, error, garbage, other_version } status = Status::ok;
  FrameType type = FrameType::hello;
  std::uint16_t version = 0;
  std::vector<std::uint8_t> payload;
  std::string why;  // for garbage
};

std::uint32_t max_payload(FrameType type) {
  switch (type) {
    case FrameType::hello: return kMaxHelloBytes;
    case FrameType::welcome: return kMaxBlobBytes;
    case FrameType::refuse: return kMaxReasonBytes;
  }
  return 0;
}

Frame read_frame(int fd, Clock::time_point deadline) {
  Frame f;
  auto from_io = [&](IoResult r) {
    f.status = r == IoResult::closed    ? Frame::Status::closed
               : r == IoResult::timeout ? Frame::Status::timeout
                                        : Frame::Status::error;
    return f;
  };
  std::uint8_t header[kHeaderBytes];
  if (auto r = read_exact(fd, header, kHeaderBytes, deadline); r != IoResult::ok) return from_io(r);
  if (std::memcmp(header, kMagic, 4) != 0) {
    f.status = Frame::Status::garbage;
    f.why = "bad magic (not a ferry rendezvous frame)";
    return f;
  }
  f.version = get_u16(header + 4);
  if (f.version != kRendezvousVersion) {
    f.status = Frame::Status::other_version;
    return f;
  }
  const std::uint16_t type = get_u16(header + 6);
  const std::uint32_t length = get_u32(header + 8);
  if (type < 1 || type > 3) {
    f.status = Frame::Status::garbage;
    f.why = fmt::format("unknown frame type {}", type);
    return f;
  }
  f.type = static_cast<FrameType>(type);
  if (length > max_payload(f.type)) {
    f.status = Frame::Status::garbage;
    f.why = fmt::format("frame type {} announces {} payload bytes (at most {})", type, length,
                        max_payload(f.type));
    return f;
  }
  f.payload.resize(length);
  if (length > 0) {
    if (auto r = read_exact(fd, f.payload.data(), length, deadline); r != IoResult::ok) {
      return from_io(r);
    }
  }
  return f;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// True once the peer's end of a connection closed or failed, or the peer sent a leave byte
// (after the handshake a peer sends nothing else, so readable means it is leaving or gone).
bool link_closed(int fd) {
  if (fd < 0) return true;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  std::uint8_t byte = 0;
  const ssize_t r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r >= 0) return true;  // end of stream, or a leave byte
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

constexpr std::uint8_t kLeaving = 'L';
constexpr std::uint8_t kFinalizing = 'F';
constexpr std::uint8_t kAborting = 'A';

// The leave handshake over `fds` (see rendezvous.hpp). A joiner (`root` false) says 'L' first
// and waits for rank 0's 'L'; rank 0 waits for every joiner's 'L' and only then says 'L', so a
// joiner's 'L' from rank 0 means "every rank is leaving". True when every fd delivered 'L' and
// none 'A' before `window_end`; false at once when one closed, failed or said 'A'.
bool exchange_leave(const std::vector<int>& fds, Clock::time_point window_end, bool root) {
  auto say_leaving = [&] {
    for (int fd : fds) {
      const std::uint8_t byte = kLeaving;
      (void)::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  };
  if (!root) say_leaving();
  std::vector<bool> leaving(fds.size(), false);
  while (true) {
    bool all = true;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      std::uint8_t bytes[8];
      while (true) {
        const ssize_t r = ::recv(fds[i], bytes, sizeof bytes, MSG_DONTWAIT);
        if (r == 0) {
          // End of stream: after its 'L' the peer decided (its 'F' came first) and shut its
          // sending side; before it, the peer closed or died: not together.
          if (leaving[i]) break;
          return false;
        }
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return false;
        }
        for (ssize_t k = 0; k < r; ++k) {
          if (bytes[k] == kLeaving) {
            leaving[i] = true;
          } else if (bytes[k] != kFinalizing) {
            return false;  // 'A' or garbage
          }
        }
      }
      all = all && leaving[i];
    }
    if (all) {
      if (root) say_leaving();
      return true;
    }
    if (Clock::now() >= window_end) return false;
    std::vector<pollfd> polls;
    for (int fd : fds) polls.push_back(pollfd{fd, POLLIN, 0});
    (void)::poll(polls.data(), polls.size(), std::min(ms_left(window_end), 50));
  }
}

void announce(const std::vector<int>& fds, bool finalize) noexcept {
  for (int fd : fds) {
    const std::uint8_t byte = finalize ? kFinalizing : kAborting;
    (void)::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
  }
}

std::string endpoint(const GroupAddress& a) {
  return fmt::format("{}:{}", a.master_address, a.master_port);
}

void check_address(const GroupAddress& a) {
  if (a.master_address.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous: master_address is empty");
  }
  if (a.group_name.empty() || a.group_name.size() > kMaxGroupNameBytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous: group_name must be 1..{} bytes (got {})",
         kMaxGroupNameBytes, a.group_name.size());
  }
  if (a.world_size < 1) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous of group '{}': world_size must be >= 1",
         a.group_name);
  }
}

}  // namespace

std::vector<std::uint8_t> encode_frame(FrameType type, const std::vector<std::uint8_t>& payload,
                                       std::uint16_t version) {
  std::vector<std::uint8_t> out(kMagic, kMagic + 4);
  put_u16(out, version);
  put_u16(out, static_cast<std::uint16_t>(type));
  put_u32(out, static_cast<std::uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<std::uint8_t> encode_hello(std::uint32_t rank, std::uint32_t world_size,
                                       const std::string& group_name) {
  std::vector<std::uint8_t> payload;
  put_u32(payload, rank);
  put_u32(payload, world_size);
  put_u16(payload, static_cast<std::uint16_t>(group_name.size()));
  payload.insert(payload.end(), group_name.begin(), group_name.end());
  return encode_frame(FrameType::hello, payload);
}

std::string describe_ranks(const std::vector<std::uint32_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// ---- rank 0 ---------------------------------------------------------------------------------

RendezvousServer::RendezvousServer(GroupAddress address, std::vector<std::uint8_t> blob)
    : address_(std::move(address)), blob_(std::move(blob)) {
  check_address(address_);
  if (blob_.size() > kMaxBlobBytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous of group '{}': blob of {} bytes (at most {})",
         address_.group_name, blob_.size(), kMaxBlobBytes);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address_.master_port);
  if (int rc = ::getaddrinfo(address_.master_address.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous of group '{}': cannot resolve {}: {}",
         address_.group_name, endpoint(address_), ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
    } else {
      last_error = errno_text(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    fail(FERRY_STATUS_IO, "rendezvous of group '{}': cannot listen on {}: {}",
         address_.group_name, endpoint(address_), last_error);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  address_.master_port = port_;
  links_.assign(address_.world_size, -1);
}

RendezvousServer::~RendezvousServer() {
  close_fd(listen_fd_);
  for (int& fd : links_) close_fd(fd);
}

void RendezvousServer::serve(Clock::time_point deadline) {
  auto missing = [&] {
    std::vector<std::uint32_t> ranks;
    for (std::uint32_t r = 1; r < links_.size(); ++r) {
      if (links_[r] < 0) ranks.push_back(r);
    }
    return ranks;
  };
  for (auto waiting = missing(); !waiting.empty(); waiting = missing()) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      fail(FERRY_STATUS_IO, "rendezvous of group '{}' on {}: poll failed: {}",
           address_.group_name, endpoint(address_), errno_text(errno));
    }
    if (ready == 0) {
      fail(FERRY_STATUS_TIMEOUT,
           "rendezvous of group '{}' on {}: {} of world size {} did not join before the deadline "
           "(phase 'rendezvous')",
           address_.group_name, endpoint(address_), describe_ranks(waiting), address_.world_size);
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    handle(fd, std::min(deadline, Clock::now() + kHelloGrace));
  }
}

void RendezvousServer::handle(int fd, Clock::time_point deadline) {
  auto refuse = [&](const std::string& reason) {
    refusals_.push_back(reason);
    std::vector<std::uint8_t> text(reason.begin(), reason.end());
    if (text.size() > kMaxReasonBytes) text.resize(kMaxReasonBytes);
    write_all(fd, encode_frame(FrameType::refuse, text), deadline);
    ::close(fd);
  };
  Frame f = read_frame(fd, deadline);
  switch (f.status) {
    case Frame::Status::ok: break;
    case Frame::Status::other_version:
      refuse(fmt::format("rendezvous protocol version {} is not supported (rank 0 speaks {})",
                         f.version, kRendezvousVersion));
      return;
    case Frame::Status::garbage:
      refusals_.push_back("garbage: " + f.why);
      ::close(fd);
      return;
    default:
      refusals_.push_back("a connection closed or stalled before its HELLO");
      ::close(fd);
      return;
  }
  if (f.type != FrameType::hello || f.payload.size() < 10) {
    refuse("expected a HELLO frame (rank, world_size, group name)");
    return;
  }
  const std::uint32_t rank = get_u32(f.payload.data());
  const std::uint32_t world = get_u32(f.payload.data() + 4);
  const std::uint16_t name_len = get_u16(f.payload.data() + 8);
  if (f.payload.size() != 10u + name_len) {
    refuse(fmt::format("HELLO length {} does not match its group name length {}",
                       f.payload.size(), name_len));
    return;
  }
  const std::string group(f.payload.begin() + 10, f.payload.end());
  if (group != address_.group_name) {
    refuse(fmt::format("group '{}' is not the group '{}' served here", group, address_.group_name));
    return;
  }
  if (world != address_.world_size) {
    refuse(fmt::format("rank {} says world_size {} but group '{}' has world_size {}", rank, world,
                       group, address_.world_size));
    return;
  }
  if (rank == 0 || rank >= address_.world_size) {
    refuse(fmt::format("rank {} is out of range 1..{} of group '{}'", rank,
                       address_.world_size - 1, group));
    return;
  }
  if (links_[rank] >= 0) {
    refuse(fmt::format("rank {} of group '{}' joined already", rank, group));
    return;
  }
  if (write_all(fd, encode_frame(FrameType::welcome, blob_), deadline) != IoResult::ok) {
    refusals_.push_back(fmt::format("rank {} left before it got the id", rank));
    ::close(fd);
    return;
  }
  links_[rank] = fd;
}

std::vector<std::uint32_t> RendezvousServer::dead_ranks() const {
  std::vector<std::uint32_t> dead;
  for (std::uint32_t r = 1; r < links_.size(); ++r) {
    if (links_[r] >= 0 && link_closed(links_[r])) dead.push_back(r);
  }
  return dead;
}

void RendezvousServer::shutdown_links() noexcept {
  for (int fd : links_) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

bool RendezvousServer::leave_together(Clock::time_point window_end) {
  std::vector<int> fds;
  for (std::uint32_t r = 1; r < links_.size(); ++r) {
    if (links_[r] < 0) return false;
    fds.push_back(links_[r]);
  }
  return exchange_leave(fds, window_end, true);
}

void RendezvousServer::announce_leave(bool finalize) noexcept {
  std::vector<int> fds;
  for (std::uint32_t r = 1; r < links_.size(); ++r) {
    if (links_[r] >= 0) fds.push_back(links_[r]);
  }
  announce(fds, finalize);
}

// ---- joining ranks ------------------------------------------------------------------------

RendezvousClient::~RendezvousClient() { close_fd(fd_); }

std::vector<std::uint8_t> RendezvousClient::join(const GroupAddress& address, std::uint32_t rank,
                                                 Clock::time_point deadline) {
  check_address(address);
  if (rank == 0 || rank >= address.world_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "rendezvous of group '{}': rank {} is out of range 1..{}",
         address.group_name, rank, address.world_size - 1);
  }
  close_fd(fd_);
  const std::string where = fmt::format("rank {} of group '{}'", rank, address.group_name);

  // Phase 1: connect, retrying while rank 0 is not listening yet.
  std::string last_error = "not tried";
  const std::string port = std::to_string(address.master_port);
  while (fd_ < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(address.master_address.c_str(), port.c_str(), &hints, &found);
        rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* ai = found; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          ai->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          if (::poll(&p, 1, std::min(ms_left(deadline), 1000)) == 1) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0) {
          fd_ = fd;
        } else {
          last_error = errno_text(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(found);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      fail(FERRY_STATUS_TIMEOUT,
           "{}: rank 0 at {} did not accept a connection before the deadline (phase 'connect to "
           "rank 0'; last error: {})",
           where, endpoint(address), last_error);
    }
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  // Phase 2: HELLO, then the id.
  if (write_all(fd_, encode_hello(rank, address.world_size, address.group_name), deadline) !=
      IoResult::ok) {
    close_fd(fd_);
    fail(FERRY_STATUS_PEER_FAILED, "{}: rank 0 at {} closed the connection before the HELLO "
                                   "was sent (phase 'send hello')",
         where, endpoint(address));
  }
  Frame f = read_frame(fd_, deadline);
  auto give_up = [&](ferry_status_code_t code, const std::string& why) {
    close_fd(fd_);
    fail(code, "{}: {} (rank 0 at {}, phase 'await the id from rank 0')", where, why,
         endpoint(address));
  };
  switch (f.status) {
    case Frame::Status::ok: break;
    case Frame::Status::timeout:
      give_up(FERRY_STATUS_TIMEOUT, "rank 0 sent no id before the deadline");
      break;
    case Frame::Status::closed:
      give_up(FERRY_STATUS_PEER_FAILED, "rank 0 closed the connection without an answer");
      break;
    case Frame::Status::other_version:
      give_up(FERRY_STATUS_INCOMPATIBLE,
              fmt::format("rank 0 answered with rendezvous protocol version {} (this rank speaks "
                          "{})",
                          f.version, kRendezvousVersion));
      break;
    case Frame::Status::garbage:
      give_up(FERRY_STATUS_CORRUPT_DATA, "rank 0 answered garbage: " + f.why);
      break;
    case Frame::Status::error:
      give_up(FERRY_STATUS_IO, "reading rank 0's answer failed");
      break;
  }
  if (f.type == FrameType::refuse) {
    give_up(FERRY_STATUS_INCOMPATIBLE,
            "rank 0 refused: " + std::string(f.payload.begin(), f.payload.end()));
  }
  if (f.type != FrameType::welcome) {
    give_up(FERRY_STATUS_CORRUPT_DATA, "rank 0 answered a frame that is not WELCOME");
  }
  return std::move(f.payload);
}

bool RendezvousClient::root_alive() const { return !link_closed(fd_); }

void RendezvousClient::shutdown_link() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool RendezvousClient::leave_together(Clock::time_point window_end) {
  if (fd_ < 0) return false;
  return exchange_leave({fd_}, window_end, false);
}

void RendezvousClient::announce_leave(bool finalize) noexcept {
  if (fd_ >= 0) announce({fd_}, finalize);
}

}  // namespace ferry::nccl
