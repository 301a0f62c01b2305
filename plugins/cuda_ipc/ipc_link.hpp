// cuda_ipc/ipc_link.hpp: the control plane of the CUDA IPC transport, with no CUDA in it: an
// Endpoint listens on a filesystem Unix socket and runs one service thread; a PeerLink is this
// side's connection to one peer's Endpoint. Handles travel as fds (SCM_RIGHTS) in ImportReply
// frames; staged buckets are announced (BucketReady) and given back (BucketReleased) as small
// frames. A peer that closes its sockets (it died or was destroyed) fails every wait on it with
// PEER_FAILED naming it; abort() fails every wait with ABORTED.
//
// Sockets between two instances A and B: A dials B (A's PeerLink, B's "incoming") and B dials A.
// A writes requests and one-way messages on the socket it dialed and reads only the replies to
// its own requests there; B's service thread reads A's messages on the incoming side, answers
// ImportRequests itself (through the ImportHandler) and files BucketReady/BucketReleased in the
// mailbox of A's nonce, where B's PeerLink to A finds them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ipc_wire.hpp"

namespace ferry::cuda_ipc {

// A staged bucket the peer announced: it lies in the peer's registration memory_id.
struct BucketReady {
  std::uint32_t index = 0;
  std::uint64_t memory_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

// What arrived from one peer instance (by nonce) on its incoming connection.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::uint32_t, BucketReady> ready;     // by bucket index
  std::multiset<std::uint32_t> released;          // bucket indices given back
  std::set<std::uint64_t> revoked;                // registrations the peer deregistered
  std::vector<std::uint64_t> newly_revoked;       // ... since the last take_newly_revoked()
  std::string dead;                                // non-empty: why the peer is gone
  std::string aborted;                             // non-empty: abort() reason
  bool incoming_open = false;
};

class Endpoint;

// This side's connection to one peer. Threading: send/request are serialized internally; the
// waits may run on any thread.
class PeerLink {
 public:
  PeerLink(Endpoint& endpoint, UniqueFd socket, Address remote, std::string name,
           std::shared_ptr<Mailbox> box);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  const std::string& name() const noexcept { return name_; }
  const Address& remote() const noexcept { return remote_; }

  // One-way message (BucketReady, BucketReleased). PEER_FAILED when the peer is gone.
  void send(const Frame& frame);
  // ImportRequest for the peer's registration `memory_id` issued by instance `owner`; returns
  // the reply frame (status OK; its fds are the caller's) or throws the peer's refusal with the
  // peer's message (FAILED_PRECONDITION for a stale key), TIMEOUT or PEER_FAILED.
  Frame import(Nonce owner, std::uint64_t memory_id, std::int64_t deadline_ns);

  // Non-blocking: takes the announcement of bucket `index` if it arrived; throws PEER_FAILED /
  // ABORTED when the peer is gone or the endpoint was aborted (after taking what arrived).
  std::optional<BucketReady> take_ready(std::uint32_t index);
  BucketReady wait_ready(std::uint32_t index, std::int64_t deadline_ns);
  // Non-blocking / blocking: the peer gave bucket `index` back.
  bool take_released(std::uint32_t index);
  void wait_released(std::uint32_t index, std::int64_t deadline_ns);
  // Throws PEER_FAILED / ABORTED when the peer is gone or the endpoint aborted.
  void check_alive();
  // True once the peer said it deregistered its registration `memory_id` (Revoked).
  bool revoked(std::uint64_t memory_id);
  // The registrations revoked since the last call (their imports here may go).
  std::vector<std::uint64_t> take_newly_revoked();

 private:
  void check_locked();  // mailbox mutex held

  Endpoint& endpoint_;
  std::mutex socket_mutex_;
  UniqueFd socket_;
  Address remote_;
  std::string name_;
  std::shared_ptr<Mailbox> box_;
  std::string broken_;  // set when the outgoing socket failed (guarded by socket_mutex_)
};

class Endpoint {
 public:
  // Answers an ImportRequest for one of this side's registrations, on the service thread:
  // returns the reply body and fds to pass (the endpoint closes the fds after sending), or
  // throws ferry::Error (sent back as a refusal with its message).
  struct ImportAnswer {
    std::vector<std::uint8_t> body;
    std::vector<UniqueFd> fds;
  };
  using ImportHandler = std::function<ImportAnswer(std::uint64_t memory_id)>;

  // Binds <socket_dir>/ferry-cuda-ipc-<pid>-<nonce>.sock (mode 0600) and starts the service
  // thread. IO naming the path when it cannot.
  Endpoint(const std::string& socket_dir, Nonce nonce, ImportHandler handler);
  // Stops the thread, closes every socket, unlinks the path.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Nonce nonce() const noexcept { return nonce_; }
  const Address& address() const noexcept { return address_; }

  // Dials `remote` (retrying until deadline_ns while its socket is not up yet) and says Hello.
  // INCOMPATIBLE when the peer is on another node (cuda_ipc is same-node only).
  std::unique_ptr<PeerLink> connect(const Address& remote, const std::string& peer_name,
                                    std::int64_t deadline_ns);
  // Every wait on every peer returns ABORTED with `reason`. Any thread.
  void abort(const std::string& reason);
  // Incoming connections currently open (tests: no growth over many sessions).
  std::size_t incoming_count();

 private:
  friend class PeerLink;
  struct Incoming {
    UniqueFd socket;
    Nonce nonce = 0;  // 0 until its Hello arrived
    std::shared_ptr<Mailbox> box;
  };
  std::shared_ptr<Mailbox> mailbox(Nonce peer);  // creates on demand
  void forget_if_unused(Nonce peer);
  void serve();
  // Handles one frame from `in`; false when the connection must be closed.
  bool handle(Incoming& in);

  Nonce nonce_;
  Address address_;
  ImportHandler handler_;
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd that stops the service thread
  std::mutex mutex_;
  std::map<Nonce, std::shared_ptr<Mailbox>> boxes_;
  std::string aborted_;
  std::size_t incoming_count_ = 0;
  std::thread thread_;
};

}  // namespace ferry::cuda_ipc
