// session/sender/handshake.hpp: opening a session over a connected channel: the data path for
// the chosen transport, then the handshake (Hello: protocol version, token, the tensor catalog,
// transport and its address, bucket capacity and slots, delivery; Welcome: the receiver's
// transport, its slot keys or, for direct delivery, a destination per tensor in its shared
// regions). What it settles is kept on the Link: the delivery mode (staged, direct, direct with
// the copies' fingerprints) that update.hpp's schedules follow. A kept session suspended by the
// receiver's release rejoins with a new data path only (rejoin_session).
#pragma once

#include <cstddef>
#include <span>

#include "session/sender/push_plan.hpp"
#include "session/sender/receiver_link.hpp"
#include "session/sender/sender_state.hpp"
#include "session/transport_choice.hpp"

namespace ferry::session {

// Opens a session on `link`'s channel for receiver `index` (link's members are owned by the
// caller, so that abort() never sees a freed one; the data path is tracked in `state` once
// made). A transport chosen by "auto" that cannot be set up, or that the receiver does not
// have, falls back to inline. Throws the receiver's refusal with its code, INCOMPATIBLE (the
// receiver chose another transport, its slots are too small, update.delivery is "direct" and no
// direct delivery was offered), CORRUPT_DATA (a malformed Welcome) or the data path's error.
void open_session(SenderState& state, Link& link, std::size_t index,
                  std::span<const TensorView> tensors, const PushPlan& plan,
                  const TransportChoice& transport);

// Rejoins a kept session the receiver suspended for a release (Link::suspended): a new data path
// of the session's transport (tracked in `state`), Rejoin with its address, the Rejoined's
// address, slot keys and regions, connect. The handshake's catalog, layout and delivery stay
// (what the link remembered of its last push: device, bucket capacity, `sent_count` tensors); a
// receiver that refuses, closes, or would now deliver otherwise fails it (the caller then opens
// a new session). With `prepare`, a direct session's data path then gets the receiver's shared
// regions ready for the puts (SenderDataPath::prepare_regions). Called by a push before it
// waits for its tensors' producers, or by the link's watcher between pushes when the receiver
// says its memory is back (Message.resumed).
void rejoin_session(SenderState& state, Link& link, std::size_t index, std::size_t sent_count,
                    bool prepare = false);

}  // namespace ferry::session
