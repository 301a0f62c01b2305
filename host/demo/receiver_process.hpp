// demo/receiver_process.hpp: the receiver side of `ferry demo` (and of `ferry bench cuda_ipc`): a
// real `ferry serve` child process, waited for through its ready file, driven over the HTTP
// control API, and always stopped (SIGTERM, then SIGKILL after a deadline).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace httplib {
class Client;
}

namespace ferry::demo {

struct ReceiverOptions {
  std::filesystem::path exe;             // the `ferry` executable
  std::vector<std::string> global_args;  // placed before "serve" (--config, --set, --plugin-dir)
  std::vector<std::string> serve_args;   // placed after "serve"
  std::filesystem::path run_dir;         // ready file and serve.log (the child's stdout+stderr)
  double ready_deadline_s = 120;         // until the ready file names the port
  double request_deadline_s = 120;       // per HTTP request (read and write timeouts)
  std::string token;                     // sent as a bearer token when not empty
};

// An HTTP answer: the status (0 when no answer came) and the body parsed as JSON (null when the
// body is not JSON).
struct Answer {
  int status = 0;
  std::string text;
  nlohmann::json body;
};

class ReceiverProcess {
 public:
  // Starts `exe global_args... serve serve_args... --port 0 --ready-file F` and waits until F
  // names the port. Throws ferry::Error: PEER_FAILED when the child exits first (with its exit
  // status and the end of its log), TIMEOUT when the deadline passes (the child is
  // stopped), IO when it cannot be started.
  explicit ReceiverProcess(ReceiverOptions options);
  // Stops the child if it still runs.
  ~ReceiverProcess();
  ReceiverProcess(const ReceiverProcess&) = delete;
  ReceiverProcess& operator=(const ReceiverProcess&) = delete;

  int port() const noexcept { return port_; }
  pid_t pid() const noexcept { return pid_; }

  Answer get(const std::string& path);
  Answer post(const std::string& path, const nlohmann::json& body);

  // Sends SIGTERM, waits up to `deadline_s`, then SIGKILLs. Returns a description of how it
  // ended ("exited with status 0", "killed by signal 9 after the deadline"). Idempotent.
  std::string stop(double deadline_s = 10);

  // Whether the child is still running (reaps it when it has exited); how it ended otherwise.
  bool running();
  const std::string& how_it_ended() const noexcept { return end_; }

  // The last `lines` lines of the child's log (stdout and stderr).
  std::string log_tail(std::size_t lines = 20) const;

 private:
  ReceiverOptions options_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string end_;  // how it ended, once reaped
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;

  bool reap(bool block);
  void wait_ready();
};

}  // namespace ferry::demo
