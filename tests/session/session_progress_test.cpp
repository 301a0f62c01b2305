// `ferry push` shows its progress on stderr: with stderr a pipe, a plain line every
// progress_interval_ms (none for a push done sooner); with stderr a pseudo-terminal, one line
// redrawn in place; none with --no-progress or progress = "never". A slow link is stood in for
// by `ferry push --test-bucket-delay-ms` (every bucket takes that much longer). /metrics' update
// histograms count the pushes.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <regex>
#include <sstream>

#include "session_fixture.hpp"

namespace ferry::test {
namespace {

struct Output {
  int status = -1;     // exit code; -1 when it did not exit in time (then killed)
  std::string output;  // stdout and stderr as they came
};

// Runs FERRY_EXE with `args`, its stdout and stderr on a pipe, or on the slave side of a new
// pseudo-terminal when `terminal`, with `env` added; reads until it exits (or 60 s pass).
Output run_ferry_on(bool terminal, const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env) {
  const std::string exe = required_env("FERRY_EXE");
  int out = -1;
  pid_t pid = -1;
  if (terminal) {
    pid = ::forkpty(&out, nullptr, nullptr, nullptr);
  } else {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
    } else {
      ::close(fds[1]);
      out = fds[0];
    }
  }
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Output run;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{out, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const ssize_t n = ::read(out, buf, sizeof buf);
    if (n <= 0) break;  // EOF (a pty answers EIO once the child is gone)
    run.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out);
  int status = 0;
  if (std::chrono::steady_clock::now() >= deadline) ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) run.status = WEXITSTATUS(status);
  return run;
}

class SessionProgress : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }
  static std::unique_ptr<TwoVersions> versions_;

  // `ferry push` of v2 as `version` in 512-byte buckets (the model is ~5 KiB), each bucket
  // `delay_ms` slower, lines every 300 ms.
  Output push(const ServeProcess& serve, int version, bool terminal, long delay_ms,
           std::vector<std::string> extra = {}, bool short_interval = true) {
    std::vector<std::string> args = {"--log-level", "warn"};
    if (short_interval) args.insert(args.end(), {"--set", "progress_interval_ms=300"});
    args.insert(args.end(), {"push", "--to", address_of(serve), "--transport", "inline",
                             "--model-path", versions_->v2_path(), "--version",
                             std::to_string(version), "--bucket-bytes", "512"});
    if (delay_ms > 0) args.insert(args.end(), {"--test-bucket-delay-ms", std::to_string(delay_ms)});
    args.insert(args.end(), extra.begin(), extra.end());
    return run_ferry_on(terminal, args, {});
  }
};
std::unique_ptr<TwoVersions> SessionProgress::versions_;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

const std::regex kProgressLine(
    R"(push of version (\d+): [0-9.]+ / [0-9.]+ KiB \((\d+)%\)(, [0-9.]+ MB/s(, .+ left)?)?)");
const std::regex kClosingLine(R"(push of version (\d+): [0-9.]+ KiB in [0-9.]+ s \([0-9.]+ MB/s\))");

TEST_F(SessionProgress, PipedPushPrintsALineEveryIntervalThenAClosingOne) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto run = push(serve, 7, /*terminal=*/false, /*delay_ms=*/150);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.output.find('\r'), std::string::npos) << run.output;  // nothing drawn in place
  int progress = 0;
  int closing = 0;
  int last_percent = -1;
  for (const auto& line : lines_of(run.output)) {
    std::smatch m;
    if (std::regex_match(line, m, kProgressLine)) {
      EXPECT_EQ(m[1], "7");
      const int percent = std::stoi(m[2]);
      EXPECT_GE(percent, last_percent) << run.output;
      last_percent = percent;
      ++progress;
    } else if (std::regex_match(line, m, kClosingLine)) {
      ++closing;
    }
  }
  // At least 10 buckets of 150 ms or more: 1.5 s, a line every 0.3 s.
  EXPECT_GE(progress, 3) << run.output;
  EXPECT_EQ(closing, 1) << run.output;
  EXPECT_NE(run.output.find("committed version 7 via inline"), std::string::npos) << run.output;
  EXPECT_EQ(version_of(serve), 7);
}

TEST_F(SessionProgress, TerminalPushRedrawsOneLineInPlace) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto run = push(serve, 8, /*terminal=*/true, /*delay_ms=*/150);
  ASSERT_EQ(run.status, 0) << run.output;
  // Each draw returns to the line's start and erases the rest of it; only the closing draw ends
  // the line (the terminal turns "\n" into "\r\n").
  std::size_t draws = 0;
  for (std::size_t at = run.output.find("\rpush of version 8: "); at != std::string::npos;
       at = run.output.find("\rpush of version 8: ", at + 1)) {
    ++draws;
  }
  EXPECT_GE(draws, 4u) << run.output;  // redrawn every 200 ms after 0.5 s of ~1.5 s or more
  const std::size_t closing = run.output.rfind("\rpush of version 8: ");
  ASSERT_NE(closing, std::string::npos);
  const std::string last = run.output.substr(closing + 1, run.output.find('\x1b', closing) - closing - 1);
  EXPECT_TRUE(std::regex_match(last, kClosingLine)) << last;
  EXPECT_EQ(run.output.compare(run.output.find('\x1b', closing), 5, "\x1b[K\r\n"), 0) << run.output;
  // Before it, the draws follow each other on one line.
  const std::string before = run.output.substr(0, closing);
  EXPECT_EQ(before.find("\n", before.find("\rpush of version 8: ")), std::string::npos) << before;
  EXPECT_EQ(version_of(serve), 8);
}

TEST_F(SessionProgress, NoProgressWhenAskedOrForAQuickPush) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto flag = push(serve, 2, /*terminal=*/false, 100, {"--no-progress"});
  ASSERT_EQ(flag.status, 0) << flag.output;
  EXPECT_EQ(flag.output.find("push of version"), std::string::npos) << flag.output;
  const auto never_on_terminal = push(serve, 3, /*terminal=*/true, 100, {"--progress", "never"});
  ASSERT_EQ(never_on_terminal.status, 0) << never_on_terminal.output;
  EXPECT_EQ(never_on_terminal.output.find("push of version"), std::string::npos)
      << never_on_terminal.output;
  // The config key, and "terminal" off a terminal.
  for (const auto& [version, set] : std::vector<std::pair<int, std::string>>{
           {4, "progress=never"}, {5, "progress=terminal"}}) {
    const auto run = run_ferry_on(
        false,
        {"--log-level", "warn", "--set", "progress_interval_ms=300", "--set", set, "push", "--to",
         address_of(serve), "--transport", "inline", "--model-path", versions_->v2_path(),
         "--version", std::to_string(version), "--bucket-bytes", "512",
         "--test-bucket-delay-ms", "100"},
        {});
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_EQ(run.output.find("push of version"), std::string::npos) << set << ": " << run.output;
  }
  // The default interval (5 s) with a push of well under a second: nothing.
  const auto quick = push(serve, 6, /*terminal=*/false, 0, {}, /*short_interval=*/false);
  ASSERT_EQ(quick.status, 0) << quick.output;
  EXPECT_EQ(quick.output.find("push of version"), std::string::npos) << quick.output;
  EXPECT_EQ(version_of(serve), 6);
  // /metrics' histograms count the session pushes as they count the initial load: 6 updates.
  const auto metrics = serve.get("/metrics");
  EXPECT_NE(metrics.text.find("\nferry_update_seconds_count 6\n"), std::string::npos) << metrics.text;
  EXPECT_NE(metrics.text.find("\nferry_update_bytes_bucket{le=\"+Inf\"} 6\n"), std::string::npos)
      << metrics.text;
}

TEST_F(SessionProgress, AnUnknownModeOrATooShortIntervalIsRefusedByName) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto run = push(serve, 2, false, 0, {"--progress", "sometimes"});
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_NE(run.output.find("--progress 'sometimes': must be one of auto, terminal, lines, never"),
            std::string::npos)
      << run.output;
  const auto set = run_ferry_on(false, {"--set", "progress=sometimes", "push", "--to",
                                        address_of(serve), "--synthetic", "--version", "2"},
                                {});
  EXPECT_EQ(set.status, 1) << set.output;
  EXPECT_NE(set.output.find("'progress' must be one of auto, terminal, lines, never"),
            std::string::npos)
      << set.output;
  const auto interval = run_ferry_on(false, {"--set", "progress_interval_ms=5", "push", "--to",
                                             address_of(serve), "--synthetic", "--version", "2"},
                                     {});
  EXPECT_EQ(interval.status, 1) << interval.output;
  EXPECT_NE(interval.output.find("'progress_interval_ms' must be in [100, 604800000], got 5"),
            std::string::npos)
      << interval.output;
  EXPECT_EQ(version_of(serve), 1);
}

}  // namespace
}  // namespace ferry::test
