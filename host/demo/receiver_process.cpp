// demo/receiver_process.cpp: the `ferry serve` child process of `ferry demo` (see
// receiver_process.hpp): fork/exec with the log redirected, the ready-file wait, HTTP requests and
// the stop sequence.
#include "demo/receiver_process.hpp"

#include <fcntl.h>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

namespace ferry::demo {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(10);

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return fmt::format("ended with wait status {}", status);
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

// A whole line naming a port ("12345\n"), or 0 while the file is missing or half-written.
int read_port(const fs::path& file) {
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty() || text.back() != '\n') return 0;
  try {
    const int port = std::stoi(text);
    return port > 0 && port < 65536 ? port : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

ReceiverProcess::ReceiverProcess(ReceiverOptions options) : options_(std::move(options)) {
  fs::create_directories(options_.run_dir);
  const fs::path ready = options_.run_dir / "serve.ready";
  const fs::path log = options_.run_dir / "serve.log";
  fs::remove(ready);

  std::vector<std::string> args{options_.exe.string()};
  args.insert(args.end(), options_.global_args.begin(), options_.global_args.end());
  args.push_back("serve");
  args.insert(args.end(), options_.serve_args.begin(), options_.serve_args.end());
  for (const char* a : {"--host", "127.0.0.1", "--port", "0", "--ready-file"}) args.push_back(a);
  args.push_back(ready.string());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) fail(FERRY_STATUS_IO, "cannot create {}: {}", log.string(), std::strerror(errno));
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int exec_pipe[2] = {-1, -1};  // the child writes errno here when exec fails
  if (null_fd < 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    fail(FERRY_STATUS_IO, "cannot prepare the receiver process: {}", std::strerror(err));
  }
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive a demo that is killed
    if (::getppid() != parent) ::_exit(126);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    const int err = errno;
    [[maybe_unused]] auto n = ::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(exec_pipe[1]);
  ::close(log_fd);
  ::close(null_fd);
  if (pid_ < 0) {
    ::close(exec_pipe[0]);
    fail(FERRY_STATUS_IO, "cannot fork the receiver process: {}", std::strerror(fork_errno));
  }
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    reap(true);
    fail(FERRY_STATUS_IO, "cannot run {}: {}", options_.exe.string(), std::strerror(exec_errno));
  }
  try {
    wait_ready();
  } catch (...) {
    stop();
    throw;
  }
  client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
  const auto seconds = static_cast<time_t>(std::ceil(options_.request_deadline_s));
  client_->set_connection_timeout(10);
  client_->set_read_timeout(seconds);
  client_->set_write_timeout(seconds);
  if (!options_.token.empty()) client_->set_bearer_token_auth(options_.token);
}

ReceiverProcess::~ReceiverProcess() {
  try {
    stop();
  } catch (...) {
    // A destructor must not throw; stop() only fails if waitpid does, and then nothing is left.
  }
}

void ReceiverProcess::wait_ready() {
  const fs::path ready = options_.run_dir / "serve.ready";
  const auto deadline = after(options_.ready_deadline_s);
  while (true) {
    if (reap(false)) {
      fail(FERRY_STATUS_PEER_FAILED,
           "the receiver (ferry serve, pid {}) {} before it was ready; the end of its log ({}):\n{}",
           pid_, end_, (options_.run_dir / "serve.log").string(), log_tail());
    }
    port_ = read_port(ready);
    if (port_ > 0) return;
    if (Clock::now() > deadline) {
      const std::string ended = stop();
      fail(FERRY_STATUS_TIMEOUT,
           "the receiver (ferry serve, pid {}) did not write its ready file {} within {:.0f} s "
           "and was stopped (it {}); the end of its log:\n{}",
           pid_, ready.string(), options_.ready_deadline_s, ended, log_tail());
    }
    std::this_thread::sleep_for(kPoll);
  }
}

bool ReceiverProcess::reap(bool block) {
  if (reaped_) return true;
  if (pid_ <= 0) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  reaped_ = true;
  std::error_code ignored;  // a stale ready file would name a dead port
  fs::remove(options_.run_dir / "serve.ready", ignored);
  end_ = r == pid_ ? describe_status(status) : fmt::format("could not be waited for ({})",
                                                            std::strerror(errno));
  return true;
}

std::string ReceiverProcess::stop(double deadline_s) {
  client_.reset();
  if (pid_ <= 0) return "was not started";
  if (reap(false)) return end_;
  // `ferry serve` takes SIGTERM through sigwait() once it serves; before that (or when it
  // hangs) only SIGKILL ends it, hence the deadline.
  ::kill(pid_, SIGTERM);
  const auto deadline = after(deadline_s);
  while (!reap(false)) {
    if (Clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      reap(true);
      end_ += fmt::format(", as it had not stopped {:.0f} s after SIGTERM", deadline_s);
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  return end_;
}

bool ReceiverProcess::running() { return !reap(false); }

std::string ReceiverProcess::log_tail(std::size_t lines) const {
  std::ifstream in(options_.run_dir / "serve.log");
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back("  | " + line);
    if (tail.size() > lines) tail.pop_front();
  }
  if (tail.empty()) return "  | (empty)";
  std::ostringstream out;
  for (std::size_t i = 0; i < tail.size(); ++i) out << (i ? "\n" : "") << tail[i];
  return out.str();
}

namespace {

Answer to_answer(const httplib::Result& result) {
  Answer a;
  if (!result) {
    a.text = httplib::to_string(result.error());
    return a;
  }
  a.status = result->status;
  a.text = result->body;
  a.body = nlohmann::json::parse(a.text, nullptr, /*allow_exceptions=*/false);
  if (a.body.is_discarded()) a.body = nullptr;
  return a;
}

}  // namespace

Answer ReceiverProcess::get(const std::string& path) {
  if (!client_) fail(FERRY_STATUS_FAILED_PRECONDITION, "the receiver is not running");
  return to_answer(client_->Get(path));
}

Answer ReceiverProcess::post(const std::string& path, const nlohmann::json& body) {
  if (!client_) fail(FERRY_STATUS_FAILED_PRECONDITION, "the receiver is not running");
  return to_answer(client_->Post(path, body.dump(), "application/json"));
}

}  // namespace ferry::demo
