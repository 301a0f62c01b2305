// cuda_ipc/ipc_wire.cpp: address and key blobs, framed control messages and SCM_RIGHTS fd
// passing of the CUDA IPC transport (see ipc_wire.hpp).
#include "ipc_wire.hpp"

#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace ferry::cuda_ipc {
namespace {

constexpr std::uint32_t kAddressMagic = 0x41495046;  // "FPIA": ferry cuda-ipc address
constexpr std::uint32_t kKeyMagic = 0x4b495046;      // "FPIK": ferry cuda-ipc key
constexpr std::uint32_t kFrameMagic = 0x46495046;    // "FPIF": ferry cuda-ipc frame
constexpr std::uint32_t kWireVersion = 1;
constexpr std::size_t kHeaderBytes = 12;  // magic u32, type u16, reserved u16, length u32

void put_le(std::uint8_t* at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_le(const std::uint8_t* at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  return v;
}

std::string errno_text(int err) { return std::strerror(err); }

// Waits until `socket` is readable/writable or the deadline passes. Returns false on timeout.
bool wait_socket(int socket, short events, std::int64_t deadline_ns) {
  for (;;) {
    const std::int64_t left = deadline_ns - monotonic_ns();
    if (left <= 0) return false;
    pollfd p{socket, events, 0};
    const int ms = static_cast<int>(std::min<std::int64_t>(left / 1'000'000 + 1, 1000));
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the read/write report the error
  }
}

}  // namespace

Nonce random_nonce() {
  Nonce n = 0;
  while (n == 0) {
    if (::getrandom(&n, sizeof n, 0) != static_cast<ssize_t>(sizeof n)) {
      n = static_cast<Nonce>(monotonic_ns()) ^ (static_cast<Nonce>(::getpid()) << 32);
    }
  }
  return n;
}

std::int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string local_host() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

std::string local_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// ---- payloads --------------------------------------------------------------------------------

PayloadWriter& PayloadWriter::u8(std::uint8_t v) {
  out_.push_back(v);
  return *this;
}
PayloadWriter& PayloadWriter::u32(std::uint32_t v) {
  const std::size_t at = out_.size();
  out_.resize(at + 4);
  put_le(out_.data() + at, v, 4);
  return *this;
}
PayloadWriter& PayloadWriter::u64(std::uint64_t v) {
  const std::size_t at = out_.size();
  out_.resize(at + 8);
  put_le(out_.data() + at, v, 8);
  return *this;
}
PayloadWriter& PayloadWriter::str(const std::string& s) {
  u32(static_cast<std::uint32_t>(s.size()));
  out_.insert(out_.end(), s.begin(), s.end());
  return *this;
}
PayloadWriter& PayloadWriter::bytes(std::span<const std::uint8_t> b) {
  u32(static_cast<std::uint32_t>(b.size()));
  out_.insert(out_.end(), b.begin(), b.end());
  return *this;
}

std::span<const std::uint8_t> PayloadReader::take(std::size_t n) {
  if (n > in_.size() - at_) {
    fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} is truncated ({} bytes, needs more than {})",
         what_, in_.size(), at_ + n - 1);
  }
  auto out = in_.subspan(at_, n);
  at_ += n;
  return out;
}
std::uint8_t PayloadReader::u8() { return take(1)[0]; }
std::uint32_t PayloadReader::u32() {
  return static_cast<std::uint32_t>(get_le(take(4).data(), 4));
}
std::uint64_t PayloadReader::u64() { return get_le(take(8).data(), 8); }
std::string PayloadReader::str() {
  auto b = take(u32());
  return std::string(b.begin(), b.end());
}
std::vector<std::uint8_t> PayloadReader::bytes() {
  auto b = take(u32());
  return {b.begin(), b.end()};
}

// ---- blobs -----------------------------------------------------------------------------------

std::vector<std::uint8_t> encode_address(const Address& a) {
  return PayloadWriter()
      .u32(kAddressMagic)
      .u32(kWireVersion)
      .u64(a.nonce)
      .u32(a.pid)
      .str(a.host)
      .str(a.boot_id)
      .str(a.socket_path)
      .take();
}

Address decode_address(std::span<const std::uint8_t> bytes) {
  PayloadReader r(bytes, "address blob");
  if (bytes.size() < 8 || r.u32() != kAddressMagic) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "cuda_ipc: the peer's address blob ({} bytes) is not a cuda_ipc address (another "
         "transport's?)",
         bytes.size());
  }
  if (const auto v = r.u32(); v != kWireVersion) {
    fail(FERRY_STATUS_INCOMPATIBLE, "cuda_ipc: the peer's address has wire version {}, this is {}",
         v, kWireVersion);
  }
  Address a;
  a.nonce = r.u64();
  a.pid = r.u32();
  a.host = r.str();
  a.boot_id = r.str();
  a.socket_path = r.str();
  if (!r.done()) fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: address blob has trailing bytes");
  if (a.socket_path.empty()) fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: address has no socket");
  return a;
}

std::vector<std::uint8_t> encode_key(const Key& k) {
  return PayloadWriter()
      .u32(kKeyMagic)
      .u32(kWireVersion)
      .u64(k.owner)
      .u64(k.memory_id)
      .u64(k.offset)
      .u64(k.size)
      .u8(static_cast<std::uint8_t>(k.kind))
      .take();
}

Key decode_key(std::span<const std::uint8_t> bytes) {
  PayloadReader r(bytes, "remote key");
  if (bytes.size() < 8 || r.u32() != kKeyMagic) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "cuda_ipc: remote key ({} bytes) is not a cuda_ipc key (packed by another transport?)",
         bytes.size());
  }
  if (const auto v = r.u32(); v != kWireVersion) {
    fail(FERRY_STATUS_INCOMPATIBLE, "cuda_ipc: remote key has wire version {}, this is {}", v,
         kWireVersion);
  }
  Key k;
  k.owner = r.u64();
  k.memory_id = r.u64();
  k.offset = r.u64();
  k.size = r.u64();
  const auto kind = r.u8();
  if (kind != static_cast<std::uint8_t>(ShareKind::Vmm) &&
      kind != static_cast<std::uint8_t>(ShareKind::Legacy)) {
    fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: remote key has unknown share kind {}", kind);
  }
  k.kind = static_cast<ShareKind>(kind);
  if (!r.done()) fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: remote key has trailing bytes");
  return k;
}

void check_key_owner(const Key& key, Nonce peer_nonce, const std::string& peer) {
  if (key.owner != peer_nonce) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "cuda_ipc: stale key: memory {} was registered by instance {:016x}, but {} is now "
         "instance {:016x} (a restarted peer or an earlier session); ask the peer for a new key",
         key.memory_id, key.owner, peer, peer_nonce);
  }
}

// ---- frames ----------------------------------------------------------------------------------

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}
void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void send_frame(int socket, const Frame& frame, const std::string& peer) {
  if (frame.payload.size() > kMaxPayload || frame.fds.size() > kMaxFds) {
    fail(FERRY_STATUS_INTERNAL, "cuda_ipc: frame to {} too large ({} bytes, {} fds)", peer,
         frame.payload.size(), frame.fds.size());
  }
  std::vector<std::uint8_t> bytes(kHeaderBytes + frame.payload.size());
  put_le(bytes.data(), kFrameMagic, 4);
  put_le(bytes.data() + 4, static_cast<std::uint16_t>(frame.type), 2);
  put_le(bytes.data() + 6, 0, 2);
  put_le(bytes.data() + 8, frame.payload.size(), 4);
  std::copy(frame.payload.begin(), frame.payload.end(), bytes.begin() + kHeaderBytes);

  std::size_t sent = 0;
  bool fds_sent = frame.fds.empty();
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  while (sent < bytes.size()) {
    iovec iov{bytes.data() + sent, bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) {
      const std::size_t fd_bytes = sizeof(int) * frame.fds.size();
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(fd_bytes);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fd_bytes);
      std::memcpy(CMSG_DATA(c), frame.fds.data(), fd_bytes);
    }
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_socket(socket, POLLOUT, monotonic_ns() + 1'000'000'000);
        continue;
      }
      fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc: sending to {} failed: {} (peer gone?)", peer,
           errno_text(errno));
    }
    fds_sent = true;
    sent += static_cast<std::size_t>(n);
  }
}

Frame recv_frame(int socket, std::int64_t deadline_ns, const std::string& peer) {
  Frame frame;
  std::vector<std::uint8_t> header(kHeaderBytes);
  std::vector<std::uint8_t>* buffer = &header;
  std::size_t got = 0;
  bool have_header = false;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  auto close_all = [&] {
    for (int fd : frame.fds) ::close(fd);
    frame.fds.clear();
  };
  for (;;) {
    if (got == buffer->size()) {
      if (have_header) break;
      if (get_le(header.data(), 4) != kFrameMagic) {
        close_all();
        fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent a frame without the cuda_ipc magic",
             peer);
      }
      frame.type = static_cast<MessageType>(get_le(header.data() + 4, 2));
      const std::uint64_t length = get_le(header.data() + 8, 4);
      if (length > kMaxPayload) {
        close_all();
        fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent a {}-byte frame (limit {})", peer,
             length, kMaxPayload);
      }
      frame.payload.resize(length);
      buffer = &frame.payload;
      got = 0;
      have_header = true;
      continue;
    }
    if (!wait_socket(socket, POLLIN, deadline_ns)) {
      close_all();
      fail(FERRY_STATUS_TIMEOUT, "cuda_ipc: deadline passed waiting for a message from {}", peer);
    }
    iovec iov{buffer->data() + got, buffer->size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      close_all();
      fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc: receiving from {} failed: {}", peer,
           errno_text(errno));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          frame.fds.push_back(fd);
        }
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      close_all();
      fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent more than {} file descriptors", peer,
           kMaxFds);
    }
    if (n == 0) {
      close_all();
      fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc: {} closed its connection", peer);
    }
    got += static_cast<std::size_t>(n);
  }
  return frame;
}

}  // namespace ferry::cuda_ipc
