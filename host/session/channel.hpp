// session/channel.hpp: one session connection (TCP or Unix stream socket) carrying frames: a
// 16-byte header (magic "FRY1", kind, length) followed by either one flat Cap'n Proto message
// (session.capnp) or raw bucket bytes (the inline data path). Every read and write has a deadline;
// every error names the peer and the phase.
//
// Threading: send() and send_data() may be called from several threads (a send mutex keeps frames
// whole); receiving is for one thread at a time. shutdown() may be called from any thread and
// makes blocked calls fail promptly (this is how abort breaks a wait).
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "session.capnp.h"

namespace ferry::session {

using Clock = std::chrono::steady_clock;

// Largest Cap'n Proto message frame accepted (a catalog of ~1M tensors fits).
inline constexpr std::uint64_t kMaxMessageBytes = 64ull << 20;

enum class FrameKind : std::uint32_t { Message = 1, Data = 2 };

// A received message: owns its words and the reader over them.
class Received {
 public:
  explicit Received(kj::Array<capnp::word> words);
  wire::Message::Reader root() const { return root_; }

 private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  wire::Message::Reader root_;
};

class Channel {
 public:
  // Takes ownership of the connected socket `fd`. `peer` names the other side in every message
  // ("receiver 10.0.0.2:8000", "sender 127.0.0.1:51234").
  Channel(int fd, std::string peer);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& peer() const noexcept { return peer_; }
  int fd() const noexcept { return fd_; }

  // Sends one message frame. Throws ferry::Error: TIMEOUT (deadline), PEER_FAILED (closed/reset),
  // ABORTED (after shutdown()).
  void send(capnp::MessageBuilder& message, Clock::time_point deadline, const std::string& phase);
  // Sends one raw data frame.
  void send_data(std::span<const std::byte> bytes, Clock::time_point deadline,
                 const std::string& phase);

  // Receives the next frame, which must be a message frame of at most kMaxMessageBytes.
  // Throws ferry::Error: TIMEOUT, PEER_FAILED (closed mid-phase), CORRUPT_DATA (bad magic, wrong
  // kind, oversize, not a Cap'n Proto message), ABORTED.
  // With `spin` > 0 it polls the socket without sleeping for up to that long first: for an
  // answer due within a fraction of a millisecond (a Ready, a Committed), a thread put to sleep
  // and woken costs tens of microseconds of the round trip.
  std::unique_ptr<Received> recv(Clock::time_point deadline, const std::string& phase,
                                 std::chrono::microseconds spin = {});
  // Receives the next frame, which must be a data frame of exactly dst.size() bytes, into dst.
  void recv_data(std::span<std::byte> dst, Clock::time_point deadline, const std::string& phase);

  // Breaks every blocked and later call (any thread). Idempotent.
  void shutdown() noexcept;
  bool is_shut_down() const noexcept;

 private:
  void write_all(const void* data, std::size_t size, Clock::time_point deadline,
                 const std::string& phase);
  void read_all(void* data, std::size_t size, Clock::time_point deadline, const std::string& phase,
                bool at_frame_start, Clock::time_point spin_until = {});
  void write_header(FrameKind kind, std::uint64_t length, Clock::time_point deadline,
                    const std::string& phase);
  std::uint64_t read_header(FrameKind expected, Clock::time_point deadline,
                            const std::string& phase, Clock::time_point spin_until = {});

  int fd_ = -1;
  std::string peer_;
  std::mutex send_mutex_;
  std::atomic<bool> shut_{false};
};

// Deadline `timeout` from now.
inline Clock::time_point deadline_in(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

// Seconds from `start` until now.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The text of a message field (a reason, a name) as a string.
inline std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// Serializes a message into one flat array (what a frame carries).
kj::Array<capnp::word> flatten(capnp::MessageBuilder& message);

// ---- sockets -------------------------------------------------------------------------------

// Connects to host:port (TCP, TCP_NODELAY) within the deadline. Throws IO / TIMEOUT naming the
// address and `what`.
int connect_tcp(const std::string& host, int port, Clock::time_point deadline,
                const std::string& what);
// Connects to a Unix stream socket.
int connect_unix(const std::string& path, Clock::time_point deadline, const std::string& what);

// A bound, listening socket.
struct Listener {
  int fd = -1;
  int port = 0;           // TCP: the bound port
  std::string unix_path;  // Unix: the path (unlinked by close())
  void close() noexcept;
};
Listener listen_tcp(const std::string& host, int port);
Listener listen_unix(const std::string& path);
// Waits up to `timeout` for a connection on any of `listeners` (closed ones are skipped) and
// accepts it; returns -1 when none arrived. `peer` receives the peer's address text. One wait
// over all listeners: a connection on one is taken at once, never after another's timeout.
int accept_connection(std::span<const Listener* const> listeners,
                      std::chrono::milliseconds timeout, std::string& peer);

}  // namespace ferry::session
