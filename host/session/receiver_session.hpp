// session/receiver_session.hpp: the receiver's side of one session connection: handshake (protocol
// version, token, layout check), begin, buckets applied through the receiver's streaming update
// with double buffering, acks, commit or abort (docs/session-protocol.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "session/channel.hpp"

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

struct ReceiverSessionSettings {
  std::string name;   // this receiver, as senders know it (for the Welcome)
  std::string token;  // required in the Hello when not empty
  std::chrono::milliseconds hello_timeout{10000};
  std::chrono::milliseconds bucket_timeout{60000};  // between messages of a running session
  std::chrono::milliseconds commit_timeout{60000};
  std::uint64_t max_bucket_bytes = 16ull << 30;  // largest staging slot a sender may ask for
};

// Serves one connection to its end. Never throws: failures are logged, sent to the sender as a
// Refusal where the connection still works, and leave the receiver at its previous version.
void serve_session(Channel& channel, receiver::Receiver& receiver,
                   const registry::Registry& registry, const config::Config& config,
                   const ReceiverSessionSettings& settings);

}  // namespace ferry::session
