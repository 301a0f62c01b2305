// bench/common/baseline.cpp: the child process that measures the PyTorch baselines
// (baseline.hpp): spawned with posix_spawn, its output read with poll() against a deadline.
#include "bench/common/baseline.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <sstream>

#include "bench/common/ferry_program.hpp"
#include "bench/common/python_script.hpp"
#include "common/log.hpp"

extern char** environ;

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxStdout = 1u << 20;
constexpr std::size_t kKeptStderr = 16u << 10;

// --torch-script, else bench/torch_baselines.py where find_bench_script looks; *looked is what
// the message names when it is not found.
std::string find_script(const BenchOptions& options, std::string* looked) {
  *looked = options.torch_script.empty() ? "bench/torch_baselines.py" : options.torch_script;
  return find_bench_script(options.torch_script, "torch_baselines.py");
}

struct ChildOutput {
  std::string out;
  std::string err;
  int status = 0;          // waitpid status
  bool timed_out = false;
  std::string spawn_error;  // set when the child could not be started
};

ChildOutput run_child(const std::vector<std::string>& argv, double timeout_s) {
  ChildOutput result;
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.spawn_error = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.spawn_error = std::string("pipe: ") + std::strerror(errno);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    result.spawn_error = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    close(out_pipe[0]);
    close(err_pipe[0]);
    return result;
  }
  Watchdog::set_child(pid);

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1e3));
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      result.timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(std::min<std::int64_t>(left, 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      result.spawn_error = std::string("poll: ") + std::strerror(errno);
      result.timed_out = true;  // kill the child below
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      std::string& sink = i == 0 ? result.out : result.err;
      sink.append(buffer, static_cast<std::size_t>(n));
      if (i == 0 && sink.size() > kMaxStdout) sink.erase(0, sink.size() - kMaxStdout);
      if (i == 1 && sink.size() > 4 * kKeptStderr) sink.erase(0, sink.size() - kKeptStderr);
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (result.timed_out) kill(pid, SIGKILL);
  // After its pipes closed the child is exiting; after SIGKILL it dies at once.
  while (waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  Watchdog::set_child(0);
  return result;
}

}  // namespace

Baseline run_torch_baseline(const BenchOptions& options, const std::vector<std::string>& args) {
  Baseline baseline;
  std::string looked;
  baseline.script = find_script(options, &looked);
  if (baseline.script.empty()) {
    baseline.script = looked;
    baseline.reason = looked + " not found (run from the repository root or pass --torch-script)";
    return baseline;
  }
  std::vector<std::string> argv = {options.python, baseline.script};
  argv.insert(argv.end(), args.begin(), args.end());
  // Leave the bench's own watchdog a few seconds to print the table of what was measured.
  double timeout = std::min<double>(options.baseline_timeout_s, Watchdog::seconds_left() - 10);
  if (timeout < 1) timeout = 1;
  Watchdog::phase("running the torch baseline process");
  ChildOutput child = run_child(argv, timeout);
  const auto log = logger("bench");
  if (!child.err.empty()) log->debug("torch baseline stderr:\n{}", child.err);
  if (!child.spawn_error.empty() && !child.timed_out) {
    baseline.reason = child.spawn_error;
    return baseline;
  }
  if (child.timed_out) {
    baseline.reason = fmt::format("{} was killed after {:.0f} s (--baseline-timeout)",
                                  baseline.script, timeout);
    return baseline;
  }
  const std::string line = last_line(child.out);
  const Json parsed = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool exited = WIFEXITED(child.status);
  const int code = exited ? WEXITSTATUS(child.status) : -1;
  const bool ok = parsed.is_object() && parsed.contains("ok") && parsed["ok"] == true;
  if (exited && code == 0 && ok) {
    baseline.available = true;
    baseline.data = parsed;
    return baseline;
  }
  if (parsed.is_object() && parsed.contains("unavailable") && parsed["unavailable"].is_string()) {
    baseline.reason = parsed["unavailable"].get<std::string>();
  } else if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_string()) {
    baseline.reason = parsed["error"].get<std::string>();
  } else {
    const std::string err = last_line(child.err);
    baseline.reason = err.empty() ? "it printed no JSON result" : err;
  }
  if (!exited) {
    baseline.reason += fmt::format(" (killed by signal {})", WTERMSIG(child.status));
  } else if (code != 0) {
    baseline.reason += fmt::format(" (exit {})", code);
  }
  return baseline;
}

}  // namespace ferry::bench
