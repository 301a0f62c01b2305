// bench/common/python_script.cpp: see python_script.hpp.
#include "bench/common/python_script.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "bench/common/ferry_program.hpp"
#include "common/log.hpp"

extern char** environ;

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxStdout = 4u << 20;

// The child's environment: ours, with the python/ folder beside the script's bench/ folder (a
// source checkout or a bundle) in front of PYTHONPATH, and FERRY_LIBRARY, when not set, the
// libferry.so of the ferry executable's bundle (bin/../lib) or build tree (host/cli/../capi).
std::vector<std::string> child_environment(const std::string& script, std::string* notes) {
  std::vector<std::string> env;
  std::string pythonpath;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (entry.rfind("PYTHONPATH=", 0) == 0) {
      pythonpath = entry.substr(std::strlen("PYTHONPATH="));
    } else {
      env.push_back(entry);
    }
  }
  std::error_code ec;
  const fs::path python_dir =
      fs::weakly_canonical(fs::path(script).parent_path() / ".." / "python", ec);
  if (!ec && fs::exists(python_dir / "ferry" / "__init__.py", ec)) {
    pythonpath = pythonpath.empty() ? python_dir.string() : python_dir.string() + ":" + pythonpath;
    *notes += fmt::format("PYTHONPATH starts with {}; ", python_dir.string());
  }
  if (!pythonpath.empty()) env.push_back("PYTHONPATH=" + pythonpath);
  const char* library = std::getenv("FERRY_LIBRARY");
  if (library == nullptr || *library == '\0') {
    const auto& ferry = ferry_program();
    const fs::path dir = ferry ? ferry->parent_path() : fs::path();
    for (const fs::path& c :
         {dir / ".." / "lib" / "libferry.so", dir / ".." / "capi" / "libferry.so"}) {
      if (!dir.empty() && fs::exists(c, ec)) {
        const std::string path = c.lexically_normal().string();
        env.push_back("FERRY_LIBRARY=" + path);
        *notes += fmt::format("FERRY_LIBRARY={}", path);
        break;
      }
    }
  } else {
    *notes += fmt::format("FERRY_LIBRARY={} (from the environment)", library);
  }
  return env;
}

struct ChildResult {
  std::string out;
  int status = 0;
  bool timed_out = false;
  std::string spawn_error;
};

// Runs argv with env; stdout is captured, stderr is ours (the script's progress shows live).
ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      double timeout_s) {
  ChildResult result;
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.spawn_error = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  if (rc != 0) {
    result.spawn_error = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    close(out_pipe[0]);
    return result;
  }
  Watchdog::set_child(pid);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1e3));
  pollfd fd{out_pipe[0], POLLIN, 0};
  char buffer[65536];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      result.timed_out = true;
      break;
    }
    const int ready = poll(&fd, 1, static_cast<int>(std::min<std::int64_t>(left, 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      result.spawn_error = std::string("poll: ") + std::strerror(errno);
      result.timed_out = true;  // kill the child below
      break;
    }
    if (ready == 0 || (fd.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t n = read(fd.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.out.append(buffer, static_cast<std::size_t>(n));
    if (result.out.size() > kMaxStdout) result.out.erase(0, result.out.size() - kMaxStdout);
  }
  close(fd.fd);
  // The rollout process (the script's child) exits when the script's end of its stdin closes.
  if (result.timed_out) kill(pid, SIGKILL);
  while (waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  Watchdog::set_child(0);
  return result;
}

}  // namespace

std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::string last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

void add_script_bench_options(CLI::App* app, ScriptBenchOptions* o, const std::string& name) {
  app->add_option("--python", o->python, fmt::format("interpreter for bench/{} (python3)", name));
  app->add_option("--script", o->script,
                  fmt::format("path of {} (default: searched, see bench/README.md)", name));
  app->add_option("--json", o->json_path, "write the records (a JSON array) to FILE");
  app->add_option("--timeout", o->timeout_s,
                  "give up (exit 3) after this many seconds, whatever hangs (default 570)")
      ->check(CLI::PositiveNumber);
}

int run_script_bench(const ScriptBenchOptions& o, const std::function<int(Json&)>& run) {
  Watchdog watchdog(o.timeout_s);
  Json records = Json::array();
  const int code = run(records);
  if (!o.json_path.empty() && !records.empty()) {
    write_records(o.json_path, records);
    std::printf("\nrecords written to %s\n", o.json_path.c_str());
  }
  return code;
}

ScriptRun run_bench_script(const std::string& bench, const std::string& name,
                           const std::string& given, const std::string& python,
                           const std::vector<std::string>& args, Json& record) {
  ScriptRun run;
  run.script = find_bench_script(given, name);
  if (run.script.empty()) {
    std::fprintf(stderr,
                 "ferry bench %s: %s not found (looked for --script, bench/%s under the working "
                 "directory, beside the build tree and in the bundle's bench/)\n",
                 bench.c_str(), given.empty() ? name.c_str() : given.c_str(), name.c_str());
    run.exit_code = 2;
    return run;
  }
  std::string notes;
  const std::vector<std::string> env = child_environment(run.script, &notes);
  std::vector<std::string> argv = {python, run.script};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
  fmt::print("bench {}: {}\n  ({})\n", bench, command,
             notes.empty() ? "environment as is" : notes);
  std::fflush(stdout);
  record["script"] = run.script;
  record["python"] = python;

  const double timeout = std::max(1.0, Watchdog::seconds_left() - 10);
  // The watchdog keeps the pointer: a string that outlives this call (one script per process).
  static std::string phase;
  phase = fmt::format("running bench/{}", name);
  Watchdog::phase(phase.c_str());
  const ChildResult child = run_child(argv, env, timeout);
  if (!child.out.empty()) logger("bench")->debug("{} stdout:\n{}", name, child.out);
  auto failed = [&](const std::string& why) {
    std::fprintf(stderr, "ferry bench %s: error: %s\n", bench.c_str(), why.c_str());
    record["error"] = why;
    run.exit_code = 1;
    return run;
  };
  if (!child.spawn_error.empty() && !child.timed_out) return failed(child.spawn_error);
  if (child.timed_out) {
    return failed(fmt::format("{} was killed after {:.0f} s (--timeout)", run.script, timeout));
  }
  Json parsed = Json::parse(last_line(child.out), nullptr, /*allow_exceptions=*/false);
  const bool exited = WIFEXITED(child.status);
  const int code = exited ? WEXITSTATUS(child.status) : -1;
  if (parsed.is_object() && parsed.contains("unavailable") && parsed["unavailable"].is_string()) {
    const std::string why = parsed["unavailable"].get<std::string>();
    std::printf("bench %s: unavailable (%s)\n", bench.c_str(), why.c_str());
    record["unavailable"] = why;
    run.exit_code = 0;
    return run;
  }
  // A script that ran to the end but could not verify its result exits 1 with {"ok": true}.
  if (!(exited && (code == 0 || code == 1) && parsed.is_object() && parsed.value("ok", false))) {
    std::string why = parsed.is_object() && parsed.contains("error") && parsed["error"].is_string()
                          ? parsed["error"].get<std::string>()
                          : std::string("it printed no JSON result");
    why += exited ? fmt::format(" (exit {})", code)
                  : fmt::format(" (killed by signal {})", WTERMSIG(child.status));
    return failed(why);
  }
  run.result = std::move(parsed);
  return run;
}

std::string json_ms(const Json& row, const char* key) {
  return row.contains(key) && row[key].is_number()
             ? fmt::format("{:.2f}", row[key].get<double>() * 1e3)
             : "-";
}

std::string json_ratio(const Json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? fmt::format("{:.2f}", row[key].get<double>())
                                                   : "-";
}

int keep_script_result(const ScriptRun& run, const std::string& bench, const std::string& case_name,
                       double target, Json& record, Json& records) {
  const Json& parsed = run.result;
  if (parsed.value("device", std::string("cuda")) != "cpu") {
    const Json header = record_header(bench, case_name, Device::cuda);
    record["device"] = header["device"];
    record["machine"] = header["machine"];
  }
  record["target"] = target;
  record["verified"] = parsed.value("verified", false);
  record["result"] = parsed;
  records.push_back(record);
  return parsed.value("verified", false) ? 0 : 1;
}

}  // namespace ferry::bench
