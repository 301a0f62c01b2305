// session/sender/sender_state.hpp: what the session threads of one Sender share: its config and
// options, the per-receiver results of the running push, and the channels and data paths that
// abort() reaches. The handshake (handshake.hpp) and the update (update.hpp) take it from the
// Sender (sender.cpp).
//
// Threading: `mutex` guards results, channels, data_paths and the abort state; the rest is set
// at construction and read-only afterwards.
#pragma once

#include <ferry/sdk/error.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "session/channel.hpp"
#include "session/data_path.hpp"
#include "session/sender/sender.hpp"

namespace ferry::session {

// Staging slots per session: double buffering (slot k % kSlots is reused only after the ack of
// bucket k - kSlots).
inline constexpr std::uint32_t kSlots = 2;

// Throws the receiver's Refusal, if `root` is one, with its code: "<what>: <its message>".
inline void throw_if_refused(wire::Message::Reader root, const std::string& what) {
  if (root.which() != wire::Message::REFUSAL) return;
  auto r = root.getRefusal();
  fail(static_cast<ferry_status_code_t>(r.getCode()), "{}: {}", what, text(r.getMessage()));
}

struct SenderState {
  SenderState(const config::Config& c, const registry::Registry& r, SenderOptions o)
      : config(c), registry(r), options(std::move(o)) {}

  config::Config config;
  const registry::Registry& registry;
  SenderOptions options;

  mutable std::mutex mutex;  // guards results, channels, data paths, abort state
  std::vector<ReceiverResult> results;
  std::set<Channel*> channels;
  std::set<SenderDataPath*> data_paths;
  bool running = false;
  bool aborted = false;
  std::string abort_reason;

  // Both the options and the configuration (update.keep_sessions) allow it. A sharded push's
  // kept session joins the receiver's next sharded update at its Begin (same rank and blocks).
  bool keep_sessions() const {
    return options.keep_sessions && config.update.keep_sessions;
  }
  // The running push's rank and world (world 0: not sharded); set by push().
  ShardSpec shard;
  bool sharded() const { return shard.world > 0; }
  // Whole pushes go as rank 0 of a 1-rank sharded update: every receiver of the last whole push
  // takes only parts of the tensors (ReceiverResult::takes_pieces; docs/sharded.md, "One
  // trainer, tensor-parallel engines"). Push thread only.
  bool whole_as_rank = false;
  // A sharded push: every view it declares (the blocks it sends and its replicas), in the
  // Hello's order; set by push() for its duration.
  std::span<const TensorView> declared;

  void set_result(std::size_t i, const ReceiverResult& r) {
    std::lock_guard lock(mutex);
    results[i] = r;
  }

  bool is_aborted(std::string& reason) const {
    std::lock_guard lock(mutex);
    reason = abort_reason;
    return aborted;
  }

  // Throws ABORTED once abort() was called.
  void throw_if_aborted() const {
    std::lock_guard lock(mutex);
    if (aborted) fail(FERRY_STATUS_ABORTED, "aborted: {}", abort_reason);
  }

  // abort() reaches `data` while it is tracked.
  void track(SenderDataPath* data, bool on) {
    if (data == nullptr) return;
    std::lock_guard lock(mutex);
    if (on) {
      data_paths.insert(data);
    } else {
      data_paths.erase(data);
    }
  }
};

}  // namespace ferry::session
