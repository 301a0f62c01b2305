// session/sharded_update.cpp: one update assembled from the sessions of several sender ranks
// (see session/sharded_update.hpp).
#include "session/sharded_update.hpp"

#include <ferry/sdk/dtype.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "common/log.hpp"
#include "receiver/receiver.hpp"

namespace ferry::session {

ShardedUpdate::ShardedUpdate(receiver::Receiver& receiver, std::uint32_t world,
                             std::chrono::milliseconds join_timeout,
                             std::chrono::milliseconds bucket_timeout,
                             std::shared_ptr<ShardedUpdate> previous)
    : receiver_(receiver),
      world_(world),
      join_timeout_(join_timeout),
      bucket_timeout_(bucket_timeout),
      created_(std::chrono::steady_clock::now()),
      ranks_(world),
      previous_(std::move(previous)) {}

ShardedUpdate::~ShardedUpdate() {
  if (worker_.joinable()) worker_.join();
}

bool ShardedUpdate::accepting() const { return phase_ == Phase::joining && joined_ < world_; }

std::string ShardedUpdate::missing_ranks_locked(bool Rank::*flag) const {
  std::string out;
  for (std::uint32_t r = 0; r < world_; ++r) {
    if (!(ranks_[r].*flag)) out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
  }
  return out;
}

void ShardedUpdate::throw_failure_locked() const {
  fail(error_code_ == FERRY_STATUS_OK ? FERRY_STATUS_ABORTED : error_code_, "{}", error_);
}

void ShardedUpdate::fail_locked(std::unique_lock<std::mutex>& lock, ferry_status_code_t code,
                                std::string message) noexcept {
  if (phase_ == Phase::failed || phase_ == Phase::done) return;
  phase_ = Phase::failed;
  error_code_ = code;
  try {
    error_ = fmt::format(
        "sharded update of {} senders aborted: {} (the receiver keeps version {})", world_,
        message, receiver_.version().number);
  } catch (...) {
    error_ = message;
  }
  std::vector<ShardMember*> members;
  for (const auto& r : ranks_) {
    if (r.joined && r.join.member != nullptr) members.push_back(r.join.member);
  }
  const std::string text = error_;
  // The members are called without the lock; none of them may leave (and be destroyed) before
  // these calls returned: leave() waits for stopping_ to fall back to 0.
  ++stopping_;
  changed_.notify_all();
  lock.unlock();
  logger("session")->warn("{}", text);
  for (auto* m : members) m->stop(code, text);
  lock.lock();
  --stopping_;
  changed_.notify_all();
}

void ShardedUpdate::add(ShardJoin join, std::unique_lock<std::mutex>& lock) {
  const std::uint32_t rank = join.rank;
  if (join.world != world_) {
    std::string joined;
    for (std::uint32_t r = 0; r < world_; ++r) {
      if (ranks_[r].joined) joined += fmt::format("{}{}", joined.empty() ? "" : ", ", r);
    }
    const std::string message =
        fmt::format("rank {} ({}) joined with a world of {} senders, but rank(s) {} declared {}",
                    rank, join.peer, join.world, joined, world_);
    fail_locked(lock, FERRY_STATUS_INVALID_ARGUMENT, message);
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}", message);
  }
  if (rank >= world_ || ranks_[rank].joined) {
    const std::string message =
        rank >= world_
            ? fmt::format("rank {} ({}) is outside a world of {} senders", rank, join.peer, world_)
            : fmt::format("rank {} joined twice ({} and {})", rank, ranks_[rank].join.peer,
                          join.peer);
    fail_locked(lock, FERRY_STATUS_INVALID_ARGUMENT, message);
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}", message);
  }
  ranks_[rank].joined = true;
  ranks_[rank].join = std::move(join);
  ++joined_;
  changed_.notify_all();
}

void ShardedUpdate::wait_welcomed() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return phase_ != Phase::joining; });
  if (phase_ == Phase::failed) throw_failure_locked();
}

ShardedUpdate::Pieces ShardedUpdate::pieces(std::uint32_t rank) const {
  std::lock_guard lock(mutex_);
  return pieces_.at(rank);
}

const std::vector<std::optional<update::UpdateEngine::DirectDestination>>&
ShardedUpdate::places(std::uint32_t rank) const {
  std::lock_guard lock(mutex_);
  return places_.at(rank);
}

Holding ShardedUpdate::needed_piece(const std::map<std::string, update::TensorReads>& reads,
                                    const Holding& block) {
  const auto it = reads.find(block.tensor);
  if (it == reads.end()) return block;
  const update::TensorReads& r = it->second;
  Holding piece = block;
  if (block.extents.empty()) {
    piece.sent = block.sent && r.end_row > r.first_row;
    return piece;
  }
  // The block's rows the plan reads and, for a 2-D tensor, its columns.
  const std::uint64_t lo[2] = {r.first_row, r.first_col};
  const std::uint64_t hi[2] = {r.end_row, r.end_col};
  for (std::size_t d = 0; d < 2 && d < block.extents.size(); ++d) {
    if (d == 1 && block.extents.size() != 2) break;
    const std::uint64_t first = std::max(block.offsets[d], lo[d]);
    const std::uint64_t end = std::min(block.offsets[d] + block.extents[d], hi[d]);
    if (end <= first) {
      piece = block;
      piece.sent = false;
      return piece;
    }
    piece.offsets[d] = first;
    piece.extents[d] = end - first;
  }
  return piece;
}

void ShardedUpdate::begin(std::uint32_t rank, std::uint64_t version, const std::string& label,
                          std::uint32_t bucket_count, RankDelivery delivery) {
  std::unique_lock lock(mutex_);
  if (phase_ == Phase::failed) throw_failure_locked();
  for (std::uint32_t r = 0; r < world_; ++r) {
    if (ranks_[r].began && ranks_[r].version != version) {
      fail_locked(lock, FERRY_STATUS_INVALID_ARGUMENT,
                  fmt::format("rank {} began version {}, but rank {} began version {}", rank,
                              version, r, ranks_[r].version));
      throw_failure_locked();
    }
  }
  Rank& me = ranks_[rank];
  me.began = true;
  me.version = version;
  me.label = label;
  me.bucket_count = bucket_count;
  me.delivery = delivery;
  changed_.notify_all();
  changed_.wait(lock, [&] { return phase_ == Phase::running || phase_ == Phase::failed ||
                                   phase_ == Phase::done; });
  if (phase_ == Phase::failed) throw_failure_locked();
}

void ShardedUpdate::wait_applied(std::uint32_t rank, std::uint64_t count) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return ranks_[rank].applied >= count || phase_ == Phase::failed; });
  if (phase_ == Phase::failed) throw_failure_locked();
}

void ShardedUpdate::offer(std::uint32_t rank, update::Bucket bucket) {
  bucket.origin = rank;
  std::unique_lock lock(mutex_);
  if (phase_ == Phase::failed) throw_failure_locked();
  queue_.push_back(std::move(bucket));
  changed_.notify_all();
}

ShardOutcome ShardedUpdate::finish(std::uint32_t rank) {
  std::unique_lock lock(mutex_);
  ranks_[rank].finished = true;
  changed_.notify_all();
  changed_.wait(lock, [&] { return phase_ == Phase::done || phase_ == Phase::failed; });
  if (phase_ == Phase::failed) throw_failure_locked();
  return *outcome_;
}

namespace {

// "rank R: message", unless the message names the rank first already.
std::string with_rank(std::uint32_t rank, const std::string& message) {
  const std::string prefix = fmt::format("rank {}: ", rank);
  return message.rfind(prefix, 0) == 0 ? message : prefix + message;
}

}  // namespace

void ShardedUpdate::fail_rank(std::uint32_t rank, ferry_status_code_t code,
                         const std::string& message) noexcept {
  std::unique_lock lock(mutex_);
  std::string text;
  try {
    text = with_rank(rank, message);
  } catch (...) {
  }
  fail_locked(lock, code, std::move(text));
}

void ShardedUpdate::settled(std::uint32_t rank) {
  std::lock_guard lock(mutex_);
  if (rank < world_) ranks_[rank].settled = true;
  changed_.notify_all();
}

void ShardedUpdate::leave(std::uint32_t rank) noexcept {
  std::unique_lock lock(mutex_);
  if (rank < world_) ranks_[rank].settled = true;
  changed_.notify_all();
  changed_.wait(lock, [&] { return worker_done_ && stopping_ == 0; });
  if (rank < world_) ranks_[rank].join.member = nullptr;
}

namespace {

// What this receiver needs of each tensor: what its plan reads (docs/sharded.md), by name;
// none when the plan cannot say (every block is taken whole). `needed`: the bytes it reads
// (`whole_bytes`, every tensor once, when it cannot say).
std::map<std::string, update::TensorReads> needs_of(
    receiver::Receiver::StreamingUpdate& update, std::span<const ferry_tensor_desc_t> catalog,
    std::uint64_t whole_bytes, std::uint64_t& needed) {
  std::map<std::string, update::TensorReads> reads;
  needed = 0;
  try {
    const auto r = update.reads(catalog);
    for (std::size_t i = 0; i < r.size() && i < catalog.size(); ++i) {
      reads.emplace(catalog[i].name, r[i]);
      needed += r[i].elements * dtype_size(catalog[i].dtype);
    }
  } catch (const Error& e) {
    logger("session")->info("sharded update: every block taken whole ({})", e.what());
    reads.clear();
    needed = whole_bytes;
  }
  return reads;
}

}  // namespace

// A rank that sends only what this receiver needs (Hello.shard.sendsNeeds) learns its pieces
// from its Welcome; the others send their blocks whole.
std::vector<std::vector<Holding>> ShardedUpdate::pieces_needed(
    const std::map<std::string, update::TensorReads>& reads,
    std::span<const RankHoldings> holdings, const std::vector<bool>& sends_needs) {
  std::vector<std::vector<Holding>> pieces(holdings.size());
  for (std::size_t r = 0; r < holdings.size(); ++r) {
    pieces[r] = holdings[r].holdings;
    if (!sends_needs[r]) continue;
    for (Holding& h : pieces[r]) {
      if (h.sent) h = needed_piece(reads, h);
    }
  }
  return pieces;
}

// ---- the worker: joins, holdings and layout, begins, the update loop ------------------------

void ShardedUpdate::work() {
  std::unique_ptr<receiver::Receiver::StreamingUpdate> update;
  bool committed = false;
  try {
    // The update before this one (kept sessions join the next one at its Begin) releases the
    // update lock once its sessions settled.
    std::shared_ptr<const Plan> earlier;  // its plan, when it made one
    if (previous_) {
      std::unique_lock lock(previous_->mutex_);
      previous_->changed_.wait_until(lock, created_ + join_timeout_,
                                     [&] { return previous_->worker_done_; });
      earlier = previous_->plan_;
    }
    previous_.reset();
    using Clock = std::chrono::steady_clock;
    const auto ms_since = [](Clock::time_point t) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    };
    const double previous_ms = ms_since(created_);
    std::vector<Pieces> held;
    std::string config_json;
    std::vector<bool> sends_needs, wants_direct;
    {
      std::unique_lock lock(mutex_);
      const bool all = changed_.wait_until(lock, created_ + join_timeout_, [&] {
        return joined_ == world_ || phase_ == Phase::failed;
      });
      if (phase_ == Phase::failed) throw_failure_locked();
      if (!all) {
        fail_locked(lock, FERRY_STATUS_TIMEOUT,
                    fmt::format("rank(s) {} did not join within {} ms of the first",
                                missing_ranks_locked(&Rank::joined), join_timeout_.count()));
        throw_failure_locked();
      }
      for (std::uint32_t r = 0; r < world_; ++r) {
        held.push_back(ranks_[r].join.holdings);
        if (config_json.empty()) config_json = ranks_[r].join.config_json;
        sends_needs.push_back(ranks_[r].join.sends_needs);
        wants_direct.push_back(ranks_[r].join.wants_direct);
      }
    }
    const double joined_ms = ms_since(created_);
    auto phase_start = Clock::now();
    // The update before worked out the same holdings (kept sessions: every update), and no
    // rank asks for destinations to be shared anew: its layout, and below its pieces.
    const bool any_direct = std::find(wants_direct.begin(), wants_direct.end(), true) !=
                            wants_direct.end();
    if (earlier && (any_direct || earlier->sends_needs != sends_needs)) earlier.reset();
    // The ranks' holdings by value, unless every rank joined with the very holdings the plan
    // before was made from (kept sessions: the same object at every Begin).
    std::vector<RankHoldings> holdings;
    if (!earlier || earlier->held != held) {
      for (std::uint32_t r = 0; r < world_; ++r) {
        holdings.push_back({r, held[r] ? *held[r] : std::vector<Holding>{}});
      }
      if (earlier && earlier->holdings != holdings) earlier.reset();
      if (earlier) {  // alike, from sessions opened since: recognised by address from now on
        auto again = std::make_shared<Plan>(*earlier);
        again->held = held;
        earlier = std::move(again);
      }
    }
    layout_ = earlier ? earlier->layout : check_holdings(holdings, world_);
    const double holdings_ms = ms_since(phase_start);
    phase_start = Clock::now();
    std::vector<ferry_tensor_desc_t> catalog;
    catalog.reserve(layout_.tensors.size());
    for (const auto& t : layout_.tensors) {
      ferry_tensor_desc_t d{};
      d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
      d.name = t.name.c_str();
      d.dtype = t.dtype;
      d.ndim = static_cast<std::uint32_t>(t.shape.size());
      for (std::size_t k = 0; k < t.shape.size() && k < FERRY_MAX_DIMS; ++k) d.shape[k] = t.shape[k];
      catalog.push_back(d);
    }
    try {
      // Waits for a brief holder of the lock, as a session's handshake does (another
      // sender's rejoin when the receiver resumed).
      update = receiver_.open_session(catalog, config_json, nullptr, join_timeout_ / 2);
    } catch (const Error& e) {
      fail(e.code(), "layout check refused: {}", e.what());
    }
    const double open_ms = ms_since(phase_start);
    phase_start = Clock::now();
    signature_ = update->layout_signature();
    num_params_ = static_cast<std::uint32_t>(update->num_params());
    epoch_ = update->memory_epoch();
    if (earlier && earlier->signature != signature_) earlier.reset();  // another layout since
    std::vector<Pieces> pieces;
    std::uint64_t needed = 0;
    if (earlier) {
      pieces = earlier->pieces;
      needed = earlier->needed_bytes;
    } else {
      for (auto& p : pieces_needed(needs_of(*update, catalog, layout_.needed_bytes, needed),
                                   holdings, sends_needs)) {
        pieces.push_back(std::make_shared<const std::vector<Holding>>(std::move(p)));
      }
    }
    const double reads_ms = ms_since(phase_start);
    phase_start = Clock::now();
    // Where the pieces of the ranks that asked for direct delivery may be written in place
    // (their sessions offer them, session/receiver_session.cpp); none is not an error: those
    // ranks stage.
    std::vector<std::vector<std::optional<update::UpdateEngine::DirectDestination>>> places(
        world_);
    std::map<std::string, std::uint32_t> index;
    for (std::uint32_t i = 0; i < catalog.size(); ++i) index.emplace(catalog[i].name, i);
    for (std::uint32_t r = 0; r < world_; ++r) {
      if (!wants_direct[r]) continue;
      std::vector<update::UpdateEngine::BlockRef> blocks;
      std::vector<std::size_t> of;  // the holding of each block
      for (std::size_t k = 0; k < pieces[r]->size(); ++k) {
        const Holding& h = (*pieces[r])[k];
        if (!h.sent) continue;
        blocks.push_back({index.at(h.tensor), h.offsets, h.extents});
        of.push_back(k);
      }
      places[r].resize(pieces[r]->size());
      try {
        const auto dests = update->block_destinations(catalog, blocks);
        for (std::size_t b = 0; b < dests.size() && b < of.size(); ++b) places[r][of[b]] = dests[b];
      } catch (const Error& e) {
        logger("session")->debug("sharded update: rank {}: no direct delivery ({})", r, e.what());
        places[r].assign(pieces[r]->size(), std::nullopt);
      }
    }
    // Where a rank's Begin waits when its session rejoins (kept sessions join at their Begin).
    logger("session")->debug(
        "sharded update of {} ranks: the previous one done {:.3f} ms after the first join, all "
        "joined at {:.3f} ms; holdings checked in {:.3f} ms, session opened in {:.3f} ms, "
        "needs in {:.3f} ms, pieces and destinations in {:.3f} ms{}",
        world_, previous_ms, joined_ms, holdings_ms, open_ms, reads_ms, ms_since(phase_start),
        earlier ? " (the update before's plan)" : "");
    std::uint64_t version = 0;
    std::string label;
    {
      std::unique_lock lock(mutex_);
      if (phase_ == Phase::failed) throw_failure_locked();
      if (!any_direct) {
        plan_ = earlier ? earlier
                        : std::make_shared<const Plan>(
                              Plan{held, std::move(holdings), sends_needs, signature_,
                                   layout_, pieces, needed});
      }
      pieces_ = std::move(pieces);
      places_ = std::move(places);
      needed_bytes_ = needed;
      phase_ = Phase::welcomed;
      welcomed_at_ = Clock::now();
      changed_.notify_all();
      const bool all = changed_.wait_until(
          lock, std::chrono::steady_clock::now() + bucket_timeout_, [&] {
            if (phase_ == Phase::failed) return true;
            for (const auto& r : ranks_) {
              if (!r.began) return false;
            }
            return true;
          });
      if (phase_ == Phase::failed) throw_failure_locked();
      if (!all) {
        fail_locked(lock, FERRY_STATUS_TIMEOUT,
                    fmt::format("rank(s) {} did not begin within {} ms",
                                missing_ranks_locked(&Rank::began), bucket_timeout_.count()));
        throw_failure_locked();
      }
      version = ranks_[0].version;
      label = ranks_[0].label;
      all_began_at_ = Clock::now();
    }
    const auto report = update->run(*this, version,
                                    label.empty() ? std::nullopt
                                                  : std::optional<std::string>(label));
    ShardOutcome o;
    o.version = report.version.number;
    o.label = report.version.label;
    o.seconds = report.seconds;
    o.needed_bytes = needed_bytes_;
    {
      std::lock_guard lock(mutex_);
      for (const auto& r : ranks_) o.rank_bytes.push_back(r.bytes);
    }
    std::string per_rank;
    for (std::size_t r = 0; r < o.rank_bytes.size(); ++r) {
      per_rank += fmt::format("{}rank {}: {}", r ? ", " : "", r, o.rank_bytes[r]);
    }
    logger("receiver")->info(
        "update {} ('{}') from {} sender ranks: {} buckets in {:.3f} s; bytes moved per rank "
        "({}), bytes needed {}",
        o.version, o.label, world_, report.buckets, report.seconds, per_rank, o.needed_bytes);
    std::unique_lock lock(mutex_);
    if (phase_ != Phase::failed) {
      outcome_ = std::move(o);
      phase_ = Phase::done;
      committed = true;
      changed_.notify_all();
    }
  } catch (const Error& e) {
    std::unique_lock lock(mutex_);
    fail_locked(lock, e.code(), e.what());
  } catch (const std::exception& e) {
    std::unique_lock lock(mutex_);
    fail_locked(lock, FERRY_STATUS_INTERNAL, e.what());
  }
  if (committed) {
    // Each rank's session tells its sender Committed and, when kept, goes idle: from then on a
    // release of the receiver's memory (which takes the update lock) finds it and closes it. The
    // lock goes only then, on the thread that took it; the next sharded update waits for it.
    std::unique_lock lock(mutex_);
    const bool all = changed_.wait_until(lock, std::chrono::steady_clock::now() + bucket_timeout_,
                                         [&] {
                                           for (const auto& r : ranks_) {
                                             if (!r.settled) return false;
                                           }
                                           return true;
                                         });
    if (!all) {
      logger("session")->warn(
          "sharded update {}: rank(s) {} did not settle within {} ms of the commit",
          outcome_->version, missing_ranks_locked(&Rank::settled), bucket_timeout_.count());
    }
  }
  update.reset();
  std::lock_guard lock(mutex_);
  worker_done_ = true;
  changed_.notify_all();
}

// ---- the bucket source ----------------------------------------------------------------------

void ShardedUpdate::begun() {
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  logger("session")->debug(
      "sharded update of {} ranks: every rank began {:.3f} ms after its pieces were told, the "
      "update began {:.3f} ms after that",
      world_, ms(welcomed_at_, all_began_at_), ms(all_began_at_, Clock::now()));
  for (auto& r : ranks_) r.join.member->begun();
  std::lock_guard lock(mutex_);
  if (phase_ == Phase::failed) throw_failure_locked();
  phase_ = Phase::running;
  changed_.notify_all();
}

bool ShardedUpdate::next(std::uint32_t, update::Bucket& out) {
  std::unique_lock lock(mutex_);
  const auto all_finished = [&] {
    for (const auto& r : ranks_) {
      if (!r.finished) return false;
    }
    return true;
  };
  // Each session has its own bucket deadline; this one only guards against a session that
  // neither offers nor fails.
  const bool ready =
      changed_.wait_until(lock, std::chrono::steady_clock::now() + 2 * bucket_timeout_, [&] {
        return !queue_.empty() || all_finished() || phase_ == Phase::failed;
      });
  if (phase_ == Phase::failed) throw_failure_locked();
  if (!ready) {
    fail(FERRY_STATUS_TIMEOUT, "no bucket from rank(s) {} before the deadline",
         missing_ranks_locked(&Rank::finished));
  }
  if (queue_.empty()) return false;
  out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void ShardedUpdate::verify(update::Bucket& bucket) {
  applying_ = bucket.origin;
  ranks_[bucket.origin].join.member->verify(bucket);
  std::uint64_t bytes = 0;
  if (bucket.manifest) {
    for (const auto& e : bucket.manifest->tensors) bytes += e.size;
  }
  std::lock_guard lock(mutex_);
  ranks_[bucket.origin].bytes += bytes;
}

void ShardedUpdate::applied(const update::Bucket& bucket) {
  ranks_[bucket.origin].join.member->applied(bucket);
  if (bucket.in_place) {
    in_place_order_.emplace_back(bucket.origin,
                                 bucket.manifest ? bucket.manifest->tensors.size() : 0);
  }
  std::lock_guard lock(mutex_);
  ranks_[bucket.origin].applied += 1;
  changed_.notify_all();
}

void ShardedUpdate::apply_failed(const Error& error) noexcept {
  std::unique_lock lock(mutex_);
  std::string text;
  try {
    text = with_rank(applying_.load(), error.what());
  } catch (...) {
  }
  fail_locked(lock, error.code(), std::move(text));
}

update::Delivery ShardedUpdate::delivery() const {
  std::lock_guard lock(mutex_);
  bool direct = false;
  bool all_writer_prints = true;
  for (const auto& r : ranks_) {
    if (!r.delivery.direct) continue;
    direct = true;
    all_writer_prints = all_writer_prints && r.delivery.writer_prints;
  }
  if (!direct) return update::Delivery::staged;
  return all_writer_prints ? update::Delivery::in_place_writer_prints : update::Delivery::in_place;
}

update::UpdateEnd ShardedUpdate::end() {
  for (auto& r : ranks_) r.join.member->check_complete();
  update::UpdateEnd out;
  // The ranks that wrote in place with fingerprints at commit: their Commits' fingerprints,
  // laid out in the order the engine recorded the buckets (one per entry).
  std::optional<bool> at_commit;
  for (std::uint32_t r = 0; r < world_; ++r) {
    const auto& d = ranks_[r].delivery;
    if (!d.direct) continue;
    if (at_commit && *at_commit != d.prints_at_commit) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "the ranks delivering directly disagree on fingerprints at commit (rank {}: {})", r,
           d.prints_at_commit ? "at commit" : "in the manifests");
    }
    at_commit = d.prints_at_commit;
  }
  if (!at_commit || !*at_commit) return out;
  std::vector<std::size_t> taken(world_, 0);
  std::vector<std::uint64_t> prints;
  // Chunk hashes (Commit.chunkHashes): laid out alike where any rank sent them.
  bool any_chunks = false;
  for (std::uint32_t r = 0; r < world_; ++r) {
    any_chunks = any_chunks || !ranks_[r].join.member->commit_chunks().empty();
  }
  std::vector<std::vector<std::uint64_t>> chunks;
  for (const auto& [rank, entries] : in_place_order_) {
    const auto& mine = ranks_[rank].join.member->commit_prints();
    const auto& my_chunks = ranks_[rank].join.member->commit_chunks();
    if (any_chunks) {
      for (std::size_t e = taken[rank]; e < taken[rank] + entries; ++e) {
        chunks.push_back(e < my_chunks.size() ? my_chunks[e] : std::vector<std::uint64_t>{});
      }
    }
    if (taken[rank] + entries > mine.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "rank {}: its commit carries {} writer fingerprints, fewer than the entries it wrote "
           "in place",
           rank, mine.size());
    }
    prints.insert(prints.end(), mine.begin() + static_cast<std::ptrdiff_t>(taken[rank]),
                  mine.begin() + static_cast<std::ptrdiff_t>(taken[rank] + entries));
    taken[rank] += entries;
  }
  for (std::uint32_t r = 0; r < world_; ++r) {
    if (ranks_[r].delivery.direct && taken[r] != ranks_[r].join.member->commit_prints().size()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "rank {}: its commit carries {} writer fingerprints for {} entries written in place", r,
           ranks_[r].join.member->commit_prints().size(), taken[r]);
    }
  }
  out.writer_fingerprints = std::move(prints);
  out.writer_chunk_hashes = std::move(chunks);
  return out;
}

// ---- the updates being joined -----------------------------------------------------------------

std::shared_ptr<ShardedUpdate> ShardedUpdates::join(ShardJoin join) {
  std::lock_guard guard(mutex_);
  bool fresh = false;
  if (forming_) {
    std::lock_guard lock(forming_->mutex_);
    fresh = !forming_->accepting();
  }
  if (!forming_ || fresh) {
    if (join.world == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "a sharded update of 0 senders");
    forming_ = std::make_shared<ShardedUpdate>(receiver_, join.world, join_timeout_,
                                               bucket_timeout_, last_.lock());
    last_ = forming_;
    forming_->worker_ = std::thread([u = forming_.get()] { u->work(); });
  }
  std::shared_ptr<ShardedUpdate> u = forming_;
  std::unique_lock lock(u->mutex_);
  u->add(std::move(join), lock);
  if (u->joined_ == u->world_) forming_.reset();
  return u;
}

// ---- the wire ---------------------------------------------------------------------------------

std::vector<Holding> read_holdings(wire::ShardHello::Reader shard,
                                   std::span<const ferry_tensor_desc_t> descs,
                                   const std::string& where) {
  const std::uint32_t rank = shard.getRank();
  if (shard.getWorld() == 0 || rank >= shard.getWorld()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: rank {} of a world of {} senders", where, rank,
         shard.getWorld());
  }
  std::vector<Holding> out;
  for (auto h : shard.getHoldings()) {
    if (h.getTensor() >= descs.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: rank {}: a holding of tensor #{} of {}", where, rank,
           h.getTensor(), descs.size());
    }
    const ferry_tensor_desc_t& d = descs[h.getTensor()];
    Holding held;
    held.tensor = d.name;
    held.dtype = d.dtype;
    held.global_shape.assign(d.shape, d.shape + d.ndim);
    if (h.getOffsets().size() > FERRY_MAX_DIMS || h.getExtents().size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: rank {}: tensor '{}': a block of more than {} dims",
           where, rank, held.tensor, FERRY_MAX_DIMS);
    }
    for (auto v : h.getOffsets()) held.offsets.push_back(v);
    for (auto v : h.getExtents()) held.extents.push_back(v);
    held.sent = !h.getReplica();
    out.push_back(std::move(held));
  }
  return out;
}

void send_committed(Channel& channel, const ShardOutcome& o,
                    std::chrono::steady_clock::time_point deadline) {
  capnp::MallocMessageBuilder m;
  auto c = m.initRoot<wire::Message>().initCommitted();
  c.setVersion(o.version);
  c.setLabel(o.label);
  c.setSeconds(o.seconds);
  auto bytes = c.initRankBytes(static_cast<unsigned>(o.rank_bytes.size()));
  for (unsigned r = 0; r < o.rank_bytes.size(); ++r) bytes.set(r, o.rank_bytes[r]);
  c.setNeededBytes(o.needed_bytes);
  channel.send(m, deadline, "commit (committed)");
}

}  // namespace ferry::session
