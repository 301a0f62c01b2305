// session/receiver_session.hpp: the receiver's side of one session connection: handshake (protocol
// version, token, layout check), begin, then the session as a bucket source of the update loop
// (update/update_loop.hpp: double buffering, commit or abort) with its acks; a kept session then
// waits for the sender's next update (docs/session-protocol.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "session/channel.hpp"
#include "session/session_link.hpp"

namespace ferry::config {
struct Config;
}
namespace ferry::registry {
class Registry;
}
namespace ferry::receiver {
class Receiver;
}

namespace ferry::session {

class ShardedUpdates;

struct ReceiverSessionSettings {
  std::string name;   // this receiver, as senders know it (for the Welcome)
  std::string token;  // required in the Hello when not empty
  std::chrono::milliseconds hello_timeout{10000};
  std::chrono::milliseconds bucket_timeout{60000};  // between messages of a running session
  std::chrono::milliseconds commit_timeout{60000};
  std::uint64_t max_bucket_bytes = 16ull << 30;  // largest staging slot a sender may ask for
  // Agree to keep a session after its commit when the sender asks (Hello.keepSession): its next
  // update needs no handshake, data path or import of shared memory. A kept session ends after
  // `idle_timeout` without an update.
  bool keep_sessions = true;
  std::chrono::milliseconds idle_timeout{std::chrono::hours(1)};
  // Where the sessions of a sharded update (Hello.shard) meet (session/sharded_update.hpp);
  // null: sharded sessions are refused.
  std::shared_ptr<ShardedUpdates> sharded;
};

// Serves one connection to its end (a kept session: through several updates). Never throws:
// failures are logged, sent to the sender as a Refusal where the connection still works, and
// leave the receiver at its previous version. Marks `link` ended when it returns.
void serve_session(Channel& channel, receiver::Receiver& receiver,
                   const registry::Registry& registry, const config::Config& config,
                   const ReceiverSessionSettings& settings, SessionLink& link);

}  // namespace ferry::session
