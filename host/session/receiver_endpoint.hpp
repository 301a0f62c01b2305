// session/receiver_endpoint.hpp: everything a receiver serves on its one public address: the
// HTTP control API (control/) and the session protocol that senders use (negotiated from the
// same HOST:PORT). `ferry serve` and the embedded receiver of the C API both run one of these.
#pragma once

#include <memory>
#include <string>

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

class ReceiverEndpoint {
 public:
  // `receiver` and `registry` must outlive the endpoint. Uses config.receiver.host/port/token.
  ReceiverEndpoint(receiver::Receiver& receiver, const config::Config& config,
                   const registry::Registry& registry);
  ~ReceiverEndpoint();  // stops
  ReceiverEndpoint(const ReceiverEndpoint&) = delete;
  ReceiverEndpoint& operator=(const ReceiverEndpoint&) = delete;

  // Binds and serves on background threads. Throws ferry::Error (IO) naming the address.
  void start();
  // Aborts any running session (the receiver keeps its previous version), stops, joins.
  // Idempotent.
  void stop();
  // The control API's bound port (the address senders are given).
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::session
