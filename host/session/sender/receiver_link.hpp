// session/sender/receiver_link.hpp: the sender's open session with one receiver (a Link): its
// channel, its data path, what the handshake chose, and, once kept after a commit for the next
// push to the same receiver (docs/session-protocol.md, "Kept sessions"), the watcher thread that
// answers the receiver between pushes. A kept session's handshake, its data path's connect and
// whatever that imported of the receiver's memory serve every later push of the same tensors.
// The receiver's Closing (it is about to release that memory) or its disconnect makes the
// watcher drop the data path, unmapping what it imported, and then close the connection, which
// the receiver waits for. A Closing with `suspend` makes it drop only the data path and say so
// (pathDropped): the session stays, `suspended`, and rejoins (a new data path, no new handshake;
// handshake.hpp, rejoin_session) when the receiver says its memory is back (Message.resumed, on
// the watcher's thread), or at the latest at the next push.
//
// Threading: one push thread at a time owns a Link; between pushes only its watcher touches it,
// and the owner reads `closed` and `closed_why` only after stop_watching().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "session/channel.hpp"
#include "session/data_path.hpp"
#include "session/sender/push_plan.hpp"
#include "session/sender/sender.hpp"
#include "session/sender/tensor_reads.hpp"

namespace ferry::session {

struct Link {
  std::unique_ptr<Channel> channel;
  std::unique_ptr<SenderDataPath> data;
  std::string transport;  // the data path's (the Welcome's choice): "inline" or a plugin's name
  bool keep = false;      // the receiver keeps the session (Welcome.keepSession)
  // Set by the watcher, read after stop_watching(): the receiver released its memory and the
  // data path is gone (null); the session rejoins before its next Begin.
  bool suspended = false;
  bool direct = false;  // direct delivery was chosen in the handshake
  // The receiver reads the tensors in place (Welcome.readsTensors): its plan is not one whole
  // copy per tensor, and it maps what this side lends (SenderDataPath::lend).
  bool reads = false;
  // A session of one whole catalog whose receiver would take only parts of its tensors from a
  // 1-rank sharded push (Welcome.takesPieces).
  bool takes_pieces = false;
  bool writer_prints = false;     // direct, and the copies fingerprint what they write
  bool prints_at_commit = false;  // the receiver takes those with the Commit (Welcome)
  std::vector<std::pair<std::uint32_t, std::uint64_t>> destinations;  // per tensor, direct
  // Per tensor, direct, where the receiver takes its chunk hashes with the Commit: the chunk
  // index they start from, and how many bytes into the tensor that chunk begins (0, or for a
  // piece starting inside a chunk, Destination.chunkHead: the tensor is then put in two copies
  // and only the second's chunks are hashed).
  struct ChunkPlace {
    std::uint64_t base = 0;
    std::uint64_t head = 0;
  };
  std::vector<std::optional<ChunkPlace>> chunk_bases;
  // A rank's session whose receiver needs only part of its blocks (Welcome.needs): per declared
  // holding (replicas included, ignored), the piece it sends (global offsets and extents;
  // `none`: nothing). `trims`: some sent block is not sent whole; each push then sends
  // sent_views() under a plan of this session's own.
  struct Piece {
    std::vector<std::uint64_t> offsets;
    std::vector<std::uint64_t> extents;
    bool none = false;
  };
  std::vector<Piece> needs;
  bool trims = false;
  // The column pieces' contiguous copies (sent_views()), kept for the next push.
  GatherMemory gathered;
  // Set by the watcher, read after stop_watching(): the session is gone, and why.
  bool closed = false;
  std::string closed_why;

  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link();

  // What the handshake was made for (the catalog: names, dtypes, shapes in order), and whether
  // a push fits it.
  void remember(std::span<const TensorView> tensors, const PushPlan& plan);
  // `catalog_same`: same_catalog(tensors), when the caller knows it already.
  bool fits(std::span<const TensorView> tensors, const PushPlan& plan,
            std::optional<bool> catalog_same = std::nullopt) const;
  bool same_catalog(std::span<const TensorView> tensors) const;
  // A rank of a sharded trainer: the rank, world and blocks (declared, replicas included) the
  // handshake's Hello carried; a kept session serves the next push only with the same ones
  // (the receiver joins its next update with the Hello's holdings). World 0: not sharded.
  void remember_shard(const ShardSpec& shard, std::span<const TensorView> declared);
  bool same_shard(const ShardSpec& shard, std::span<const TensorView> declared) const;
  // Reads a Welcome's needs of the blocks `declared` (this push's, replicas included): each
  // within its block, narrowed on dim 0 and, for a 2-D block, dim 1 only (CORRUPT_DATA naming
  // `peer` and the tensor otherwise). Sets `needs` and `trims`; none given: every block whole.
  void read_needs(capnp::List<wire::Need>::Reader given, std::span<const TensorView> declared,
                  const std::string& peer);
  // How many views sent_views() gives.
  std::size_t sent_count(std::span<const TensorView> declared) const;
  // The views this session sends (`trims`), after the producers' work is done: of each sent
  // block of `declared`, the piece the receiver needs as a block of its own, in order, empty
  // pieces left out. A piece of rows views the block's memory; a piece of columns is a
  // contiguous copy in `gathered`.
  std::vector<TensorView> sent_views(std::span<const TensorView> declared);
  // The bucket capacity of the handshake (the receiver's slots), the device of its tensors and
  // whether they are CUDA memory (what remember() kept of the plan).
  std::uint64_t capacity() const { return capacity_; }
  int device() const { return device_; }
  bool cuda_tensors() const { return cuda_tensors_; }
  // Kept after a commit: how many tensors the session sends (its destinations, for a rejoin).
  std::size_t sent_tensors = 0;

  // After a commit, before the session is kept: the data path lets go of the push's tensors.
  void forget_push() noexcept {
    if (data) data->end_push();
  }

  // Starts the watcher; false when no thread or eventfd could be had (then not kept).
  // `rejoin`: what the watcher calls on a suspended session when the receiver says its memory is
  // back (Message.resumed); it throws when the rejoin failed (the session then ends).
  bool start_watching(const std::string& peer, std::function<void(Link&)> rejoin = {});
  // Tells the watcher to let go; stop_watching() joins it. A push asks first thing, so the
  // watcher's wake-up overlaps the push's checks.
  void ask_to_stop() noexcept;
  // The next push takes the session back (or it is destroyed).
  void stop_watching() noexcept;

 private:
  void watch(const std::string& peer);
  std::function<void(Link&)> rejoin_;

  struct Described {
    std::string name;
    ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
    std::vector<std::uint64_t> shape;
    friend bool operator==(const Described&, const Described&) = default;
  };
  std::vector<Described> catalog_;
  struct Held {
    Described block;
    std::vector<std::uint64_t> global_shape;
    std::vector<std::uint64_t> offsets;
    bool replica = false;
    friend bool operator==(const Held&, const Held&) = default;
  };
  static Held held_of(const TensorView& t);  // only the fields a Hello's holdings carry
  ShardSpec shard_{};
  std::vector<Held> held_;
  std::uint64_t capacity_ = 0;
  int device_ = -1;
  bool cuda_tensors_ = false;
  std::thread watcher_;
  int wake_fd_ = -1;
  bool stop_asked_ = false;
};

}  // namespace ferry::session
