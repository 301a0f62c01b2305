// session/sender/handshake.hpp: opening a session over a connected channel: the data path for
// the chosen transport, then the handshake (Hello: protocol version, token, the tensor catalog,
// transport and its address, bucket capacity and slots, delivery; Welcome: the receiver's
// transport, its slot keys or, for direct delivery, a destination per tensor in its shared
// regions). What it settles is kept on the Link: the delivery mode (staged, direct, direct with
// the copies' fingerprints) that update.hpp's schedules follow.
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

}  // namespace ferry::session
