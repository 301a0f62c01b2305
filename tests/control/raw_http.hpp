// tests/control/raw_http.hpp: plain TCP sockets for the control API's tests of hostile clients
// (idle and slow connections, bodies sent in pieces, malformed requests), where an HTTP client
// library would refuse to send what is needed or would hide what came back.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry::test {

// An open TCP connection to 127.0.0.1:port, closed when the object goes away.
class RawConnection {
 public:
  // Connects (blocking, within 5 s); throws std::runtime_error when it cannot.
  explicit RawConnection(int port);
  ~RawConnection();
  RawConnection(RawConnection&& other) noexcept;
  RawConnection& operator=(RawConnection&&) = delete;
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  int fd() const { return fd_; }
  // Sends all of `bytes`; false when the peer closed or reset the connection.
  bool send(const std::string& bytes);
  // Everything received until the peer closes or `timeout` passes (nullopt: the connection was
  // still open at the deadline; what arrived is kept in `partial`).
  std::optional<std::string> read_until_closed(std::chrono::milliseconds timeout);
  // One HTTP answer (head and a Content-Length body) within `timeout`; nullopt when none.
  std::optional<std::string> read_answer(std::chrono::milliseconds timeout);
  std::string partial;

 private:
  int fd_ = -1;
};

struct RawAnswer {
  int status = 0;
  std::string head;
  nlohmann::json body;  // null when the body is not JSON
};
// Parses "HTTP/1.1 <status> ...\r\n...\r\n\r\n<body>".
RawAnswer parse_answer(const std::string& text);

// Raises this test process's soft limit of open files to its hard limit; returns the limit.
std::uint64_t raise_own_file_limit();

// A value (in kB) of a field of /proc/<pid>/status ("VmRSS", "VmHWM", "Threads": the count).
std::uint64_t proc_status_value(int pid, const std::string& field);

}  // namespace ferry::test
