// session/sender/update.hpp: one update over an open session: Begin (the first copies queued
// while the receiver gets Ready, where the data path defers them), the buckets by the schedule
// of the session's delivery mode (delivery.hpp), the last acks, then Commit and the receiver's
// Committed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "session/sender/push_plan.hpp"
#include "session/sender/receiver_link.hpp"
#include "session/sender/sender_state.hpp"

namespace ferry::session {

// Pushes `version` to receiver `index` over `link` (handshake done). `result` gets the
// transport, the delivery mode, bytes and buckets as they go (and state.results the progress).
// `began` turns true once the receiver is Ready: from then on a failure is this update's, not
// the session's. Throws the receiver's refusal with its code, PEER_FAILED (it closed the
// session at Begin), CORRUPT_DATA (unexpected messages, fingerprint mismatches) or the
// channel's and data path's errors.
void run_update(SenderState& state, Link& link, std::size_t index,
                std::span<const TensorView> tensors, const PushPlan& plan, std::uint64_t version,
                const std::string& label, ReceiverResult& result, bool& began);

}  // namespace ferry::session
