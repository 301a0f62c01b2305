// session/sender/discovery.hpp: finding a receiver from the address a user gives (the HOST:PORT
// of its control API): the address parsed, the session port and Unix socket it announces
// (GET /ferry/session), the session channel connected, and the data transport for it
// (session/transport_choice.hpp, told whether the receiver is on this host or in this process).
#pragma once

#include <memory>
#include <string>

#include "session/channel.hpp"
#include "session/sender/sender.hpp"
#include "session/transport_choice.hpp"

namespace ferry::session {

struct HostPort {
  std::string host;
  int port = 0;
};

// "HOST:PORT" or "[HOST]:PORT". Throws INVALID_ARGUMENT naming the address.
HostPort parse_address(const std::string& address);

// Discovery and connect within options.connect_timeout, with options.token: the Unix socket
// when the receiver is on loopback and announces one (TCP when that fails), else TCP. Throws
// PEER_FAILED (discovery refused or unreachable), CORRUPT_DATA (no session port), IO / TIMEOUT
// (connect), each naming the receiver.
std::unique_ptr<Channel> open_channel(const std::string& address, const SenderOptions& options);

// The data transport for the receiver at `address`: options.transport, else the config's
// update.transport, chosen among the config's preference list by the plugins' capabilities.
// Throws INCOMPATIBLE where a named plugin cannot reach that receiver (choose_transport).
TransportChoice transport_for(const std::string& address, bool cuda_tensors,
                              const SenderOptions& options, const config::Config& config,
                              const registry::Registry& registry);

}  // namespace ferry::session
