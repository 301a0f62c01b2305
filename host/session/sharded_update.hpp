// session/sharded_update.hpp: one update assembled from several sender sessions (a sharded
// trainer: ranks 0 .. world-1 each holding blocks of the global tensors; docs/sharded.md). The
// sessions of one update join a ShardedUpdate; once every rank joined, their holdings are
// checked to tile every tensor exactly once (session/holdings.hpp) and the layout is checked
// (Receiver::open_session, the update lock); once every rank began the same version, the
// ShardedUpdate runs the one update loop (update/update_loop.hpp) as its bucket source: the
// buckets of all ranks, in arrival order, each verified and applied, acknowledged to its own
// sender. The update commits only when every rank's Commit arrived and every declared block was
// applied; any rank's failure (a dead or stalled sender, a refused bucket, a disagreement)
// aborts it, every session is refused with the message naming the rank, and the previous
// version stays (restored or fenced, as for any update).
//
// Kept sessions (docs/session-protocol.md, "Sharded updates"): a rank's session may stay for the
// next update, joining it at its Begin instead of its Hello. The update lock is held until every
// rank's session settled after the commit (told its sender Committed and, when kept, went idle
// where a release finds and closes it); the next update's worker waits for this one's first.
//
// Threading: each session calls from its own thread; the ShardedUpdate's worker thread opens
// the layout, runs the loop and releases the update lock (the thread that took it); the loop
// calls the members' verify()/applied() on its applying thread; a failure, on whichever thread
// it happens, calls every member's stop(). A member stays alive until leave() returned.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include "session/channel.hpp"
#include "session/holdings.hpp"
#include "update/bucket_source.hpp"
#include "update/update_engine.hpp"

namespace ferry::receiver {
class Receiver;
}

namespace ferry::session {

// A session taking part in a sharded update (receiver_session.cpp).
class ShardMember {
 public:
  virtual ~ShardMember() = default;
  // The update began: post the data path's receives and tell the sender Ready. Worker thread.
  virtual void begun() = 0;
  // Applying thread: before / after the engine applies one of this member's buckets.
  virtual void verify(update::Bucket& bucket) = 0;
  virtual void applied(const update::Bucket& bucket) = 0;
  // After the last bucket of every rank was applied: every block this sender declared arrived
  // (else throws naming the rank and the tensor). Worker thread.
  virtual void check_complete() = 0;
  // The update failed: refuse the sender with `message` and shut the connection. Any thread;
  // never throws.
  virtual void stop(ferry_status_code_t code, const std::string& message) noexcept = 0;
  // A rank delivering directly with fingerprints at commit: the writer fingerprints its Commit
  // carried, one per entry of its in-place buckets in its bucket order. Worker thread, after
  // every rank's Commit arrived.
  virtual const std::vector<std::uint64_t>& commit_prints() const = 0;
  // With them: the Commit's chunk hashes, one list per fingerprint (empty lists for entries
  // without), or none at all.
  virtual const std::vector<std::vector<std::uint64_t>>& commit_chunks() const = 0;
};

// How one rank's Begin said it delivers (Begin.direct, writerFingerprints,
// fingerprintsAtCommit): staged into its session's slots, or straight into the parameters.
struct RankDelivery {
  bool direct = false;
  bool writer_prints = false;
  bool prints_at_commit = false;
};

struct ShardJoin {
  std::uint32_t rank = 0;
  std::uint32_t world = 0;
  // Shared, not copied: a kept session joins every update with the holdings of its Hello, and
  // the worker recognises them by address (no deep comparison on the Begin's path).
  std::shared_ptr<const std::vector<Holding>> holdings;
  std::string config_json;
  std::string peer;  // the sender, as the messages name it
  ShardMember* member = nullptr;
  bool sends_needs = false;   // Hello.shard.sendsNeeds: it sends only what the receiver needs
  bool wants_direct = false;  // the session offers direct delivery where it can (places())
};

struct ShardOutcome {
  std::uint64_t version = 0;
  std::string label;
  double seconds = 0;
  std::vector<std::uint64_t> rank_bytes;  // payload bytes each rank sent
  std::uint64_t needed_bytes = 0;         // the bytes this receiver's plan reads
};

class ShardedUpdate final : public update::BucketSource {
 public:
  // `previous`: the update before this one on the same endpoint, whose worker must end (and
  // release the update lock) before this one opens the layout.
  ShardedUpdate(receiver::Receiver& receiver, std::uint32_t world,
                std::chrono::milliseconds join_timeout, std::chrono::milliseconds bucket_timeout,
                std::shared_ptr<ShardedUpdate> previous = nullptr);
  ~ShardedUpdate() override;  // joins the worker
  ShardedUpdate(const ShardedUpdate&) = delete;
  ShardedUpdate& operator=(const ShardedUpdate&) = delete;

  std::uint32_t world() const { return world_; }
  // Session thread, after its Hello: blocks until every rank joined and the layout was checked;
  // throws the update's failure. ShardedUpdates::join adds the member first (add()).
  void wait_welcomed();
  // The layout's signature and parameter count, for the Welcome (after wait_welcomed()).
  std::uint64_t layout_signature() const { return signature_; }
  std::uint32_t num_params() const { return num_params_; }
  // The receiver's memory epoch (Receiver::StreamingUpdate::memory_epoch) when this update opened
  // the layout: a kept session may write the memory it shared only while this is unchanged.
  std::uint64_t memory_epoch() const { return epoch_; }
  // After wait_welcomed(): what `rank` sends of each of its holdings (in Hello order): the
  // holding itself, or, for a rank that sends only what this receiver needs
  // (ShardJoin::sends_needs; docs/sharded.md), the holding's rows that the receiver's plan reads
  // and, for a 2-D tensor, the columns it reads of every row (update::TensorReads); `sent` false
  // for a replica and for a piece it needs none of. The same object for every update that takes
  // the plan of the one before over (Plan), so a kept rank recognises its pieces by address.
  std::shared_ptr<const std::vector<Holding>> pieces(std::uint32_t rank) const;
  // After wait_welcomed(), for a rank that asked for direct delivery (ShardJoin::wants_direct):
  // per holding, where its piece lies in the receiver's parameters when the plan takes it as
  // one contiguous copy into device memory (update::UpdateEngine::block_destinations); else
  // (and for other ranks) nullopt or empty.
  const std::vector<std::optional<update::UpdateEngine::DirectDestination>>& places(
      std::uint32_t rank) const;
  // Session thread, after its Begin: blocks until every rank began the same version and every
  // sender was told Ready; throws the failure (a rank that began another version included).
  void begin(std::uint32_t rank, std::uint64_t version, const std::string& label,
             std::uint32_t bucket_count, RankDelivery delivery);
  // Session thread: blocks until `count` of this rank's buckets were applied; throws the
  // failure.
  void wait_applied(std::uint32_t rank, std::uint64_t count);
  // Session thread: a bucket of `rank` arrived (in that session's staging slot).
  void offer(std::uint32_t rank, update::Bucket bucket);
  // Session thread: the rank's Commit arrived. Blocks until the update committed (the
  // outcome) or failed (throws the failure).
  ShardOutcome finish(std::uint32_t rank);
  // Session thread, after it told its sender Committed (and went idle, when kept): the update
  // lock may go once every rank settled (leave() settles too).
  void settled(std::uint32_t rank);
  // Any thread: `rank` failed (its message names the peer and phase): the update aborts.
  void fail_rank(std::uint32_t rank, ferry_status_code_t code, const std::string& message) noexcept;
  // Session thread, last: waits until the worker ended and no other session's failure is still
  // stopping the members; nothing calls this rank's member afterwards.
  void leave(std::uint32_t rank) noexcept;

  // ---- update::BucketSource (the worker's update loop) -----------------------------------
  bool double_buffered() const override { return true; }
  // In place when any rank delivers directly (by fingerprinting copies when every such rank
  // does); the staged ranks' buckets are applied as usual beside them.
  update::Delivery delivery() const override;
  void begun() override;
  bool next(std::uint32_t slot, update::Bucket& out) override;
  void verify(update::Bucket& bucket) override;
  void applied(const update::Bucket& bucket) override;
  void apply_failed(const Error& error) noexcept override;
  update::UpdateEnd end() override;

  // The part of a sent `block` that a plan reading `reads` needs (pieces(); and what a whole
  // sender's push as rank 0 of 1 would send a session, Welcome.takesPieces).
  static Holding needed_piece(const std::map<std::string, update::TensorReads>& reads,
                              const Holding& block);

 private:
  friend class ShardedUpdates;
  enum class Phase { joining, welcomed, begun, running, done, failed };
  struct Rank {
    bool joined = false;
    ShardJoin join;
    bool began = false;
    std::uint64_t version = 0;
    std::string label;
    std::uint32_t bucket_count = 0;
    RankDelivery delivery;
    bool finished = false;
    bool settled = false;
    std::uint64_t applied = 0;
    std::uint64_t bytes = 0;  // payload bytes of its applied entries
  };
  // Under mutex_: adds a rank; false (and fails the update) when it does not fit.
  void add(ShardJoin join, std::unique_lock<std::mutex>& lock);
  bool accepting() const;  // under mutex_
  // Each rank's pieces: of its sent blocks, what a plan reading `reads` needs where the rank
  // sends only that (`sends_needs`), else the blocks whole.
  static std::vector<std::vector<Holding>> pieces_needed(
      const std::map<std::string, update::TensorReads>& reads,
      std::span<const RankHoldings> holdings, const std::vector<bool>& sends_needs);
  void work();
  void fail_locked(std::unique_lock<std::mutex>& lock, ferry_status_code_t code,
                   std::string message) noexcept;
  [[noreturn]] void throw_failure_locked() const;
  std::string missing_ranks_locked(bool Rank::*flag) const;

  receiver::Receiver& receiver_;
  const std::uint32_t world_;
  const std::chrono::milliseconds join_timeout_;
  const std::chrono::milliseconds bucket_timeout_;
  const std::chrono::steady_clock::time_point created_;
  // When the worker told the ranks their pieces, and when the last of them began (debug log).
  std::chrono::steady_clock::time_point welcomed_at_{}, all_began_at_{};

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Phase phase_ = Phase::joining;
  ferry_status_code_t error_code_ = FERRY_STATUS_OK;
  std::string error_;
  std::vector<Rank> ranks_;
  std::uint32_t joined_ = 0;
  std::deque<update::Bucket> queue_;
  std::optional<ShardOutcome> outcome_;
  ShardLayout layout_;
  std::uint64_t signature_ = 0;
  std::uint32_t num_params_ = 0;
  std::uint64_t epoch_ = 0;
  std::shared_ptr<ShardedUpdate> previous_;  // reset by the worker once that one ended
  // What the worker worked out from the ranks' joins before the Welcomes. The next update
  // takes it over when its ranks join alike (kept sessions rejoin with their Hello's holdings
  // at every Begin, which then waits for none of this work).
  using Pieces = std::shared_ptr<const std::vector<Holding>>;
  struct Plan {
    std::vector<Pieces> held;           // each rank's ShardJoin::holdings, by address
    std::vector<RankHoldings> holdings;  // the same, by value (a rank that joined anew)
    std::vector<bool> sends_needs;
    std::uint64_t signature = 0;  // of the receiver's layout it was made for
    ShardLayout layout;
    std::vector<Pieces> pieces;
    std::uint64_t needed_bytes = 0;
  };
  std::shared_ptr<const Plan> plan_;  // set by the worker, under mutex_, when no rank is direct
  // Per rank, set before the Welcomes: pieces() and places(). needed_bytes_: the bytes this
  // receiver's plan reads (of every tensor once when not known), for the outcome.
  std::vector<Pieces> pieces_;
  std::vector<std::vector<std::optional<update::UpdateEngine::DirectDestination>>> places_;
  std::uint64_t needed_bytes_ = 0;
  // The in-place buckets in the order the loop recorded them: (rank, entries), to lay the
  // ranks' commit fingerprints out in the engine's order (end()). Applying thread, then end().
  std::vector<std::pair<std::uint32_t, std::size_t>> in_place_order_;
  bool worker_done_ = false;
  std::uint32_t stopping_ = 0;  // fail_locked calls stopping the members, outside the lock
  std::atomic<std::uint32_t> applying_{0};  // the origin of the bucket being applied
  std::thread worker_;
};

// The sharded updates of one receiver endpoint: the one being joined at a time.
class ShardedUpdates {
 public:
  ShardedUpdates(receiver::Receiver& receiver, std::chrono::milliseconds join_timeout,
                 std::chrono::milliseconds bucket_timeout)
      : receiver_(receiver), join_timeout_(join_timeout), bucket_timeout_(bucket_timeout) {}

  // Adds a session to the update being joined (a new one when none is): INVALID_ARGUMENT when
  // its rank or world does not fit that update, which then fails too (the message names both
  // ranks). Then wait_welcomed() on the result.
  std::shared_ptr<ShardedUpdate> join(ShardJoin join);

 private:
  receiver::Receiver& receiver_;
  std::chrono::milliseconds join_timeout_;
  std::chrono::milliseconds bucket_timeout_;
  std::mutex mutex_;
  std::shared_ptr<ShardedUpdate> forming_;
  std::weak_ptr<ShardedUpdate> last_;  // the latest update formed (its worker may still run)
};

// The holdings of a Hello (Hello.shard over its tensors `descs`): CORRUPT_DATA / INVALID_ARGUMENT
// naming `where` (the peer and phase) and the rank for a holding of no tensor or a bad rank.
std::vector<Holding> read_holdings(wire::ShardHello::Reader shard,
                                   std::span<const ferry_tensor_desc_t> descs,
                                   const std::string& where);

// Tells a rank's sender that the sharded update committed: the version, and the bytes each rank
// moved and the bytes needed (Committed.rankBytes, neededBytes).
void send_committed(Channel& channel, const ShardOutcome& outcome,
                    std::chrono::steady_clock::time_point deadline);

}  // namespace ferry::session
