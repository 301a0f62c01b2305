// group/rendezvous.hpp: the TCP rendezvous of a weight-update group: rank 0 (the trainer) listens
// on master_address:master_port and hands an opaque blob (the NCCL unique id) to every joining
// rank; afterwards the connections stay open as a liveness link, so a deadline that passes can be
// blamed on the rank whose connection closed.
//
// Wire format (version 1, little-endian), one frame per message:
//   magic "FRDV" (4 bytes) | version u16 | type u16 | payload length u32 | payload
//   HELLO   (joiner -> rank 0): rank u32 | world_size u32 | group name length u16 | name bytes
//   WELCOME (rank 0 -> joiner): the blob (at most kMaxBlobBytes)
//   REFUSE  (either way)      : a one-line reason (UTF-8, at most kMaxReasonBytes)
// A frame of another version is answered with REFUSE and closed; a frame with a bad magic, an
// unknown type or a payload longer than its type allows is garbage and closed. Neither counts
// as a joined rank: rank 0 keeps waiting for the real one until its deadline.
//
// Leaving (destroy_weights_update_group), after the handshake, single bytes on each link:
//   joiner -> rank 0: 'L' this rank is leaving;
//   rank 0 -> joiners: 'L' once every joiner said 'L' (so every rank is leaving);
//   then each side's decision, 'F' (it finalizes) or 'A' (it aborts locally), and the sending
//   side is shut down.
// A rank finalizes only when the leave window brought agreement (rank 0: every joiner's 'L';
// a joiner: rank 0's 'L') and no 'A': the
// NCCL finalize of a communicator completes only when every rank finalizes, so a one-sided
// destroy (or one whose peers gave up) aborts instead and returns at the window's end. These are
// the only bytes sent after the handshake, so any readable byte (or end of stream) on a link
// means that peer is leaving or gone: a rank still broadcasting names it at once.
//
// Threading: a RendezvousServer and a RendezvousClient are each used by one thread; dead_ranks()
// / root_alive() may be called from another thread than the one that made the object.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::nccl {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC, like the ABI's deadlines

inline constexpr std::uint16_t kRendezvousVersion = 1;
inline constexpr std::uint32_t kMaxBlobBytes = 64 * 1024;
inline constexpr std::uint32_t kMaxReasonBytes = 1024;
inline constexpr std::uint32_t kMaxGroupNameBytes = 256;

enum class FrameType : std::uint16_t { hello = 1, welcome = 2, refuse = 3 };

struct GroupAddress {
  std::string master_address;  // host name or IP of rank 0
  std::uint16_t master_port = 0;
  std::string group_name;
  std::uint32_t world_size = 0;
};

// Rank 0. The constructor binds and listens (IO naming the address when it cannot); port 0 picks
// a free port (port() says which).
class RendezvousServer {
 public:
  RendezvousServer(GroupAddress address, std::vector<std::uint8_t> blob);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  std::uint16_t port() const { return port_; }

  // Accepts joiners until ranks 1..world_size-1 all received the blob. TIMEOUT at `deadline`
  // naming the group, the phase and every rank that did not join ("ranks 2, 3 of 4"). Refuses
  // (and closes) a wrong version, wrong group, wrong world size, out-of-range or duplicate rank.
  void serve(Clock::time_point deadline);

  // Ranks whose link closed since serve() (a joiner that exited or crashed). Sorted.
  std::vector<std::uint32_t> dead_ranks() const;

  // Any thread: shuts every link down (the fds stay open until destruction), so each joiner's
  // root_alive() turns false: how rank 0 tells the group it gave up.
  void shutdown_links() noexcept;

  // Leave handshake with every joined rank (see the file comment): sends 'L', waits until each
  // joiner sent 'L' (true) or `window_end` passes / one said 'A' or closed (false, at once).
  bool leave_together(Clock::time_point window_end);
  // Sends 'F' (finalize) or 'A' (abort) to every joiner and shuts the sending side down.
  void announce_leave(bool finalize) noexcept;

  // Frames refused or dropped as garbage while serving (for logs and tests).
  const std::vector<std::string>& refusals() const { return refusals_; }

 private:
  void handle(int fd, Clock::time_point deadline);

  GroupAddress address_;
  std::vector<std::uint8_t> blob_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::vector<int> links_;  // index = rank; -1 until joined (rank 0 is this process)
  std::vector<std::string> refusals_;
};

// A joining rank (1..world_size-1).
class RendezvousClient {
 public:
  RendezvousClient() = default;
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  // Connects to rank 0 (retrying while it is not listening yet), sends HELLO and returns the
  // blob. TIMEOUT naming the phase ("connect to rank 0", "await the id from rank 0") at
  // `deadline`; INCOMPATIBLE when rank 0 refuses (its reason quoted) or answers another version;
  // CORRUPT_DATA for a malformed answer.
  std::vector<std::uint8_t> join(const GroupAddress& address, std::uint32_t rank,
                                 Clock::time_point deadline);

  // False once rank 0's end of the link closed (rank 0 exited or crashed).
  bool root_alive() const;

  // Any thread: shuts the link down, so rank 0's dead_ranks() names this rank.
  void shutdown_link() noexcept;

  // The leave handshake with rank 0 (as RendezvousServer's).
  bool leave_together(Clock::time_point window_end);
  void announce_leave(bool finalize) noexcept;

 private:
  int fd_ = -1;
};

// Frame codec, exposed for tests that speak the protocol by hand.
std::vector<std::uint8_t> encode_frame(FrameType type, const std::vector<std::uint8_t>& payload,
                                       std::uint16_t version = kRendezvousVersion);
std::vector<std::uint8_t> encode_hello(std::uint32_t rank, std::uint32_t world_size,
                                       const std::string& group_name);

// "ranks 2, 3" / "rank 1".
std::string describe_ranks(const std::vector<std::uint32_t>& ranks);

}  // namespace ferry::nccl
