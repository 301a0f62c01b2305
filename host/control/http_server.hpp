// control/http_server.hpp: the receiver's HTTP/JSON control API (SGLang's endpoint names and
// fields where the semantics match), plus /metrics. Binds to 127.0.0.1 unless configured
// otherwise; with a token, every mutating route requires `Authorization: Bearer <token>`. The
// server under it (limits, deadlines, which routes may wait): control/http_listener.hpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ferry::receiver {
class Receiver;
}

namespace ferry::control {

struct Route {
  const char* method;  // "GET", "POST", or both ("GET, POST")
  const char* path;
  bool mutating;       // needs the token when one is configured
  const char* summary;
  // "SGLang", "vLLM" (that framework's name and fields), "SGLang, vLLM" (both name the route
  // alike) or "ferry" (ferry's own)
  const char* source;
};

// Every route the server serves (docs/http-api.md lists the same; a test checks both).
const std::vector<Route>& routes();

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;   // 0: pick a free port (see ControlServer::port())
  std::string token;  // empty: no authentication
  // GET /ferry/session answers this JSON object text ({"protocol", "port", "unix_path"}: where the
  // session listener of session/receiver_endpoint.hpp accepts senders). Unset: the route answers
  // 404 (this process runs no session listener). Called on the I/O thread: must not block.
  std::function<std::string()> session_info;
};

class ControlServer {
 public:
  // `receiver` must outlive the server.
  ControlServer(receiver::Receiver& receiver, ServerOptions options);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Binds and starts serving on a background thread. Throws ferry::Error (IO) naming the address
  // when it cannot bind.
  void start();
  // Stops accepting, finishes in-flight requests, joins. Idempotent; safe from a signal-watching
  // thread (not from a signal handler).
  void stop();
  // The bound port (useful with port 0).
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::control
