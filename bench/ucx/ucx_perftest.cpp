// bench/ucx/ucx_perftest.cpp: runs ucx_perftest (server + client on this host) for the UCX bench's
// baselines and parses its final bandwidth.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/ucx/ucx.hpp"

namespace ferry::bench {
namespace {

// Forks and execs `argv` with UCX_TLS set (unset for ""); stdout+stderr go to `out_fd` (or
// /dev/null).
pid_t spawn(const std::vector<std::string>& argv, const std::string& tls, int out_fd) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  int fd = out_fd >= 0 ? out_fd : open("/dev/null", O_WRONLY);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  execvp(args[0], args.data());
  _exit(127);
}

void reap(pid_t pid, bool kill_first) {
  if (pid <= 0) return;
  if (kill_first) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

int next_port() {
  // A different port per run: a just-closed listener's port may still be in TIME_WAIT.
  static int counter = 0;
  return 20000 + static_cast<int>(getpid() % 5000) * 8 + (counter++ % 8);
}

}  // namespace

std::optional<double> parse_perftest_output(const std::string& output) {
  std::istringstream in(output);
  std::string line;
  std::optional<double> result;
  while (std::getline(in, line)) {
    const auto at = line.find("Final:");
    if (at == std::string::npos) continue;
    // strtod, not operator>>: an overhead column may read "inf" when a timer rounds to zero.
    std::istringstream fields(line.substr(at + 6));
    std::vector<double> numbers;
    std::string token;
    while (fields >> token) numbers.push_back(std::strtod(token.c_str(), nullptr));
    // iterations, overhead 50%ile / average / overall, bandwidth average / overall, msg rates.
    if (numbers.size() >= 6) result = numbers[5] * 1048576.0;
  }
  return result;
}

PerftestResult run_perftest(const std::string& program, const std::string& tls,
                            const std::string& test, std::uint64_t size, int iterations,
                            int timeout_s, const std::string& memory, bool error_handling) {
  PerftestResult result;
  const int warmup = iterations > 10 ? 5 : 1;
  for (int attempt = 0; attempt < 3 && !result.bytes_per_second; ++attempt) {
    const std::string port = std::to_string(next_port());
    std::vector<std::string> common = {"-t", test, "-s", std::to_string(size), "-n",
                                       std::to_string(iterations), "-w", std::to_string(warmup),
                                       "-p", port};
    if (error_handling) common.push_back("-e");
    if (memory != "host") {  // both sides' buffers of that type (UCX's default is host memory)
      common.push_back("-m");
      common.push_back(memory + "," + memory);
    }
    std::vector<std::string> server_argv = {program};
    server_argv.insert(server_argv.end(), common.begin(), common.end());
    std::vector<std::string> client_argv = {program, "localhost"};
    client_argv.insert(client_argv.end(), common.begin(), common.end());

    const pid_t server = spawn(server_argv, tls, -1);
    if (server < 0) {
      result.error = "fork failed";
      return result;
    }
    Watchdog::set_child(server);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the server listen
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) {
      reap(server, true);
      result.error = "pipe failed";
      return result;
    }
    const pid_t client = spawn(client_argv, tls, pipe_fds[1]);
    close(pipe_fds[1]);
    std::string output;
    char buf[4096];
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    bool timed_out = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            give_up - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{pipe_fds[0], POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      const ssize_t n = read(pipe_fds[0], buf, sizeof buf);
      if (n <= 0) break;
      output.append(buf, static_cast<std::size_t>(n));
    }
    close(pipe_fds[0]);
    reap(client, timed_out);
    reap(server, true);
    Watchdog::set_child(0);
    if (timed_out) {
      result.error = "ucx_perftest did not finish within " + std::to_string(timeout_s) + " s";
      return result;
    }
    result.bytes_per_second = parse_perftest_output(output);
    if (!result.bytes_per_second) {
      // Keep the last line as the reason; a refused connection is retried on another port.
      auto end = output.find_last_not_of('\n');
      auto start = output.rfind('\n', end == std::string::npos ? 0 : end);
      result.error = "no 'Final:' line from ucx_perftest" +
                     (output.empty() ? std::string(" (is it installed? apt-get install ucx-utils)")
                                     : ": " + output.substr(start == std::string::npos ? 0 : start + 1));
    }
  }
  if (result.bytes_per_second) result.error.clear();
  return result;
}

}  // namespace ferry::bench
