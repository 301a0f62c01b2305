// cuda_ipc/ipc_wire.hpp: the bytes of the CUDA IPC transport that need no GPU: the rendezvous
// address and remote-key blobs (encode, decode, stale-key checks), the framed control messages
// of the plugin's own Unix socket, and file descriptor passing with SCM_RIGHTS.
//
// Blobs and frames are little-endian, start with a magic and a version, and are decoded with
// bounds checks: a blob from another plugin, another version or a truncated copy is refused with
// INCOMPATIBLE / CORRUPT_DATA naming what was wrong, never read past its end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::cuda_ipc {

// Identity of one transport instance (one incarnation of a process's plugin for one session).
// Random 64 bits chosen at create; a restarted peer or a new session has a different one.
using Nonce = std::uint64_t;
Nonce random_nonce();

// This side's rendezvous blob (get_address): where its socket listens and who it is. boot_id
// and host make "same node" checkable at connect.
struct Address {
  Nonce nonce = 0;
  std::uint32_t pid = 0;
  std::string host;         // gethostname()
  std::string boot_id;      // /proc/sys/kernel/random/boot_id (distinguishes containers' hosts)
  std::string socket_path;  // filesystem Unix socket
};
std::vector<std::uint8_t> encode_address(const Address& address);
Address decode_address(std::span<const std::uint8_t> bytes);
// This machine's host name and boot id (what encode_address of a local Address carries).
std::string local_host();
std::string local_boot_id();

// How an allocation is shared.
enum class ShareKind : std::uint8_t {
  Vmm = 1,     // CUDA VMM chunks exported as POSIX file descriptors (ferry's CUDA store)
  Legacy = 2,  // cudaIpcGetMemHandle (cudaMalloc / PyTorch caching allocator)
};

// The remote key of one registered range (pack_key). `memory_id` names the registration inside
// the owner instance `owner`; the fds or the legacy handle are fetched over the owner's socket.
struct Key {
  Nonce owner = 0;
  std::uint64_t memory_id = 0;
  std::uint64_t offset = 0;  // of the registered base inside the first exported allocation
  std::uint64_t size = 0;    // registered bytes
  ShareKind kind = ShareKind::Vmm;
};
std::vector<std::uint8_t> encode_key(const Key& key);
Key decode_key(std::span<const std::uint8_t> bytes);
// FAILED_PRECONDITION ("stale key") unless `key` was issued by the instance `peer_nonce` that
// `peer` is connected to now.
void check_key_owner(const Key& key, Nonce peer_nonce, const std::string& peer);

// ---- control messages ------------------------------------------------------------------------

enum class MessageType : std::uint16_t {
  Hello = 1,          // first frame on a new connection: the dialer's nonce
  ImportRequest = 2,  // give me the handles of registration memory_id (issued by you, nonce)
  ImportReply = 3,    // status + handles (fds ride along with SCM_RIGHTS)
  BucketReady = 4,    // staged: bucket `index` lies in my registration memory_id at offset, size
  BucketReleased = 5, // staged: I finished reading bucket `index`; the slot is yours again
  Revoked = 6,        // my registration memory_id is gone: refuse keys naming it
};

// A frame: type + payload bytes + file descriptors (at most kMaxFds).
constexpr std::size_t kMaxFds = 64;
constexpr std::size_t kMaxPayload = 1u << 20;
struct Frame {
  MessageType type = MessageType::Hello;
  std::vector<std::uint8_t> payload;
  std::vector<int> fds;  // received: owned by the receiver of the frame (close them)
};

// Little-endian payload writer / bounds-checked reader.
class PayloadWriter {
 public:
  PayloadWriter& u8(std::uint8_t v);
  PayloadWriter& u32(std::uint32_t v);
  PayloadWriter& u64(std::uint64_t v);
  PayloadWriter& str(const std::string& s);
  PayloadWriter& bytes(std::span<const std::uint8_t> b);
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  std::vector<std::uint8_t> out_;
};
class PayloadReader {
 public:
  PayloadReader(std::span<const std::uint8_t> in, std::string what) : in_(in), what_(std::move(what)) {}
  std::uint8_t u8();
  std::uint32_t u32();
  std::uint64_t u64();
  std::string str();
  std::vector<std::uint8_t> bytes();
  bool done() const noexcept { return at_ == in_.size(); }

 private:
  std::span<const std::uint8_t> take(std::size_t n);
  std::span<const std::uint8_t> in_;
  std::size_t at_ = 0;
  std::string what_;
};

// Sends one frame on a connected stream socket, fds attached to its first byte. Throws
// PEER_FAILED naming `peer` when the socket is closed or broken (never SIGPIPE).
void send_frame(int socket, const Frame& frame, const std::string& peer);
// Receives one frame; waits at most until deadline_ns (CLOCK_MONOTONIC; TIMEOUT naming `peer`).
// PEER_FAILED when the peer closed the socket. Received fds are close-on-exec.
Frame recv_frame(int socket, std::int64_t deadline_ns, const std::string& peer);

// CLOCK_MONOTONIC now, in nanoseconds (the ABI's deadline clock).
std::int64_t monotonic_ns();

// Owns one file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const noexcept { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace ferry::cuda_ipc
