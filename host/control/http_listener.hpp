// control/http_listener.hpp: the event-driven HTTP/1.1 server under the control API (Boost.Beast
// over Asio). One I/O thread multiplexes every connection, so idle or slow clients cost a socket
// and a few kilobytes, never a thread; handlers that may block (updates, anything behind the
// receiver's update lock) run on two small worker pools (reads, changes), so that routes answered
// on the I/O thread (/health, /metrics) never wait behind them, and reads that wait for a
// stalled update never hold the threads a change needs. Protocol limits are enforced while reading:
// a deadline for a request's head (slow or idle clients), a routing decision (authentication)
// before any body byte is read, a body limit counted as bytes arrive (chunked bodies included), a
// bound on open connections.
//
// Threading: the router and the handlers it marks non-blocking run on the I/O thread and must
// never block; blocking handlers run on worker threads, at most HttpLimits::workers per pool.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::control {

struct HttpRequest {
  std::string method;         // as sent ("GET", "POST", ...)
  std::string path;           // the target without its query
  std::string query;          // the target after its first '?', not decoded (empty: none)
  std::string authorization;  // the Authorization header's value, or empty
  std::string body;           // empty while the router decides; read before the handler runs
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra header fields
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// What the router decides from a request's head, before any of its body is read.
struct Dispatch {
  // Set: this is the answer (404, 401, ...); the body is never read, the connection closes after
  // it (its unread bytes are drained and discarded, never kept).
  std::optional<HttpResponse> answer;
  HttpHandler handler;  // otherwise: called with the whole body
  enum class Thread {
    io,       // never blocks: run on the I/O thread
    reads,    // may block (waits for the update lock): the readers' pool
    changes,  // may block (updates, releases): the changes' pool
  };
  Thread thread = Thread::io;
};

struct HttpLimits {
  std::size_t max_body_bytes = 16u << 20;    // larger bodies: 413 (chunked: once it is passed)
  std::size_t max_header_bytes = 16u << 10;  // request line + header fields: else 431
  // From the moment a connection waits for a request (accepted, or the previous answer written)
  // to its head's last byte: idle keep-alives and slow clients are closed after it.
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};   // a request's whole body
  std::chrono::milliseconds write_timeout{10000};  // one answer
  std::size_t max_connections = 4096;              // open at once; more are answered 503 and closed
  unsigned workers = 4;                            // threads of each pool for blocking handlers
  std::size_t max_queued = 64;  // per pool, requests running or waiting; more: 503
};

class HttpListener {
 public:
  using Router = std::function<Dispatch(const HttpRequest& head)>;
  // The answer to a failure of the protocol itself (malformed request, a limit passed, busy):
  // the HTTP status, the ferry status it stands for, and a message naming the problem.
  using ErrorAnswer =
      std::function<HttpResponse(int status, ferry_status_code_t code, const std::string& message)>;

  HttpListener(HttpLimits limits, Router router, ErrorAnswer error_answer);
  ~HttpListener();  // stops
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (0: any free port), starts the I/O thread and the workers; returns the
  // bound port. Throws ferry::Error (IO) naming the address when it cannot bind.
  int start(const std::string& host, int port);
  // Stops accepting, closes idle connections, lets running handlers finish and their answers
  // go out (each bounded by write_timeout), joins every thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Raises this process's soft limit of open files to its hard limit (every connection is a file
// descriptor) and returns the soft limit now in force. Idempotent; any thread.
std::size_t raise_open_file_limit();

}  // namespace ferry::control
