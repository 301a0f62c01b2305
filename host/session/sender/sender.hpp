// session/sender/sender.hpp: the trainer side of ferry: pushes one versioned update (named
// tensors) to one or many receivers through the session protocol and a data transport, and
// reports the outcome per receiver. The C API (ferry_sender_*), the Python package and
// `ferry push` are thin layers over this class.
//
// Contract:
//  - Receivers are named by the address a user already knows: the HOST:PORT of the receiver's
//    control API (`ferry serve --port`, or an embedded receiver's serve port). The session and
//    data channels are negotiated from there.
//  - push() is one transaction per receiver: each receiver either commits `version` or keeps its
//    previous version (restored or fenced as the receiver's update engine defines). A receiver
//    that fails or dies is reported by its address while the others commit.
//  - Tensors are read in place (no copy before packing); they must stay valid and unchanged until
//    push() returns.
//
// Threading: push() and abort() may be called from different threads; abort() makes a running
// push() fail every receiver that has not committed yet. One push() at a time per Sender.
// Sessions are kept between pushes (SenderOptions::keep_sessions); destroying the Sender closes
// them.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "order/stream_order.hpp"

namespace ferry::config {
struct Config;
}
namespace ferry::registry {
class Registry;
}

namespace ferry::session {

// One tensor to push, viewed in place. Contiguous row-major bytes.
struct TensorView {
  std::string name;  // checkpoint name (e.g. a state_dict key)
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  const void* data = nullptr;
  ferry_memory_kind_t memory_kind = FERRY_MEMORY_HOST;
  int device = 0;  // CUDA device ordinal when memory_kind is a device kind
  // A sharded push (SenderOptions::shard_world > 0; docs/sharded.md): the view is the block of
  // the global tensor of `global_shape` that starts at `offsets` (its extents are `shape`).
  // Empty: the whole tensor (global_shape = shape). `replica`: held here, but the lowest rank
  // holding the same block sends it; declared to the receiver, not sent.
  std::vector<std::uint64_t> global_shape;
  std::vector<std::uint64_t> offsets;
  bool replica = false;
};

// How far a push has come, for a display (session/sender/push_progress.hpp). `begin` once the
// buckets are planned, `bucket` each time a receiver was handed one more bucket, `end` when
// push() returns (also after a failure).
struct PushProgress {
  enum class Event { begin, bucket, end };
  Event event = Event::begin;
  std::uint64_t version = 0;
  std::size_t receivers = 0;      // how many the push goes to
  std::size_t receiver = 0;       // bucket: which (SenderOptions::receivers order)
  std::uint64_t bytes_done = 0;   // bucket: that receiver's bucket bytes handed over so far
  std::uint64_t bytes_total = 0;  // bucket bytes per receiver
  bool all_committed = false;     // end: every receiver committed
};

struct SenderOptions {
  std::vector<std::string> receivers;  // "HOST:PORT" of each receiver's control API
  // "auto" (the first of update.transport_preference that fits), "inline" or a transport
  // plugin's name; empty: the config's update.transport.
  std::string transport;
  std::uint64_t bucket_bytes = 256ull << 20;
  std::string token;  // bearer token of the receivers' control APIs, if any
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds bucket_timeout{60000};  // per bucket: data + apply + ack
  std::chrono::milliseconds commit_timeout{60000};
  // The checkpoint's config.json text, sent in the handshake: a receiver without a layout (a
  // fresh `ferry serve`) creates its layout from the first session and may need it. Optional.
  std::string config_json;
  // Test hook, called on a receiver's session thread right after bucket `bucket` was handed to
  // that receiver (data delivered, BucketReady sent). Used by the fault tests (`ferry push` sets
  // it from its hidden --test-* options). Must be thread-safe.
  std::function<void(const std::string& receiver, std::uint32_t bucket)> after_bucket;
  // Progress (PushProgress), called on push()'s thread (begin, end) and on a receiver's session
  // thread (bucket; receivers' threads may call it at the same time). Empty: none. Must be
  // thread-safe and quick: it runs on the data path once per bucket.
  std::function<void(const PushProgress&)> progress;
  // Threads for fingerprints and packing; 0: the hardware count.
  unsigned threads = 0;
  // Direct delivery through copies that fingerprint what they write: consecutive buckets are
  // copied in groups of at least this many bytes (one flush each). Such a copy hashes each
  // 1 MiB chunk serially (~1 ms on an H200), so a launch needs thousands of chunks to fill the
  // GPU; smaller groups pipeline more finely but copy slower.
  std::uint64_t fingerprinted_group_bytes = 4ull << 30;
  // Keep each receiver's session after a commit for the next push of the same tensors (the
  // receiver agreeing): that push needs no handshake, data path set-up or import of the
  // receiver's memory. Between pushes a thread per kept session answers the receiver, which
  // suspends the session before it releases its memory: the sender unmaps what it imported and
  // the next push rejoins with a new data path only (docs/session-protocol.md, "Kept sessions").
  // The configuration's update.keep_sessions = false turns it off as well.
  bool keep_sessions = true;
  // Rejoin a kept session after the receiver's release (above); false: the receiver closes it
  // instead and the next push opens a new one (what a sender of an earlier release does).
  bool rejoin_after_release = true;
  // ...as soon as the receiver says its memory is back (its resume), on the kept session's
  // watcher thread, so the rejoin and the mapping of the resumed memory are done before the
  // next push; false: the next push rejoins (before it waits for its tensors' producers).
  bool rejoin_when_resumed = true;
  // Test hook: the protocol version the handshake claims; 0: this build's. The tests claim
  // another to see a receiver refuse it.
  std::uint32_t claimed_protocol_version = 0;
  // A sharded push: this sender is rank `shard_rank` of `shard_world` senders that together
  // make up each update (docs/sharded.md). Each receiver commits a version only when every rank
  // delivered the blocks it declared. 0: not sharded. A rank's sessions are kept, and rejoined
  // after a receiver's release, as any sender's (keep_sessions, rejoin_after_release).
  std::uint32_t shard_rank = 0;
  std::uint32_t shard_world = 0;
  // Pushes of whole tensors go as rank 0 of a 1-rank sharded update once every receiver takes
  // only parts of them (ReceiverResult::takes_pieces; update.delivery "auto"). false: always
  // whole (a test of reads in place into a tensor-parallel rank).
  bool parts_as_rank = true;
};

// One push of a sharded trainer: this sender is rank `rank` of `world` (docs/sharded.md).
struct ShardSpec {
  std::uint32_t rank = 0;
  std::uint32_t world = 0;
};

struct ReceiverResult {
  std::string address;  // as given in SenderOptions::receivers
  bool committed = false;
  std::string error;      // why not committed ("" when committed); names the phase
  std::string transport;  // the data path used ("inline", "ucx"), once negotiated
  bool direct = false;    // direct delivery: tensors were written straight into parameters
  // Direct delivery whose copies fingerprinted what they wrote (one read of the data; the
  // receiver takes or re-checks those fingerprints, its update.direct_verify).
  bool writer_fingerprints = false;
  bool reads_in_place = false;  // the receiver read the tensors in place and applied its plan
  // Of a push of whole tensors: the receiver's plan reads only parts of some (a
  // tensor-parallel rank), which a 1-rank sharded push sends it alone (Welcome.takesPieces).
  bool takes_pieces = false;
  bool reused_session = false;  // the push went through the session kept from the previous one
  ferry_status_code_t code = FERRY_STATUS_OK;  // OK when committed; else why (TIMEOUT, ...)
  std::uint64_t bytes = 0;
  std::uint64_t buckets = 0;
  double seconds = 0;
  // A sharded push, from the receiver's Committed: the payload bytes each rank moved (by
  // rank) and the bytes of every tensor once (what the receiver needed).
  std::vector<std::uint64_t> rank_bytes;
  std::uint64_t needed_bytes = 0;
};

struct PushReport {
  std::uint64_t version = 0;
  std::vector<ReceiverResult> receivers;  // in SenderOptions::receivers order
  std::uint64_t bytes = 0;                // payload bytes per receiver
  double seconds = 0;                     // from push() called to the last commit acknowledged
  // Of `seconds`: waiting for the work that produced the tensors (the push's StreamOrder).
  double producer_wait_seconds = 0;
  bool all_committed() const;
};

class Sender {
 public:
  // `registry` must outlive the sender. Nothing connects before the first push().
  Sender(const config::Config& config, const registry::Registry& registry, SenderOptions options);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Pushes `tensors` as update `version` (label: the weight_version string; default the number)
  // to every receiver. Before anything reads a tensor, push() waits for the work that produced
  // them as `producers` says (order/stream_order.hpp; the default synchronises every CUDA device
  // a tensor is on), so a fingerprint certifies final bytes. Throws ferry::Error only for bad
  // arguments (empty or duplicate names, bad dtype/shape, no receivers) and a failed wait for
  // the producers (nothing was sent then); per-receiver failures are in the report.
  // `shard`: this push is one rank's of a sharded update (overrides SenderOptions::shard_rank
  // and shard_world); the tensors are then blocks (TensorView::global_shape, offsets, replica).
  PushReport push(std::span<const TensorView> tensors, std::uint64_t version,
                  const std::optional<std::string>& label = std::nullopt,
                  const order::StreamOrder& producers = {},
                  const std::optional<ShardSpec>& shard = std::nullopt);

  // Aborts a running push (any thread). No-op when none runs.
  void abort(const std::string& reason);

  // Per-receiver state of the last (or running) push.
  std::vector<ReceiverResult> status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::session
