// registry/vetting.cpp: spawns ferry-plugin-vet per plugin file (posix_spawn: a fork without exec
// is not safe in a multithreaded host, where another thread may hold the loader's lock), reads
// its report, and turns a crash, an exit or a hang into a refusal naming the step (vetting.hpp).
#include "registry/vetting.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "common/ferry_install_paths.h"
#include "common/installed_program.hpp"
#include "common/log.hpp"
#include "ferry_registry_paths.h"
#include "registry/child_process.hpp"

extern char** environ;

namespace ferry::registry {
namespace {

namespace fs = std::filesystem;

using FileKey = std::tuple<std::string, dev_t, ino_t, off_t, std::int64_t>;

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<FileKey, std::optional<std::string>>& cache() {
  static std::map<FileKey, std::optional<std::string>> verdicts;
  return verdicts;
}

std::optional<FileKey> file_key(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const std::int64_t mtime_ns =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return FileKey{path.lexically_normal().string(), st.st_dev, st.st_ino, st.st_size, mtime_ns};
}

// A reason line for a child that did not report a verdict.
std::string unfinished_reason(const ChildEnd& end, std::chrono::milliseconds timeout) {
  const std::string stage = last_line_with(end.report, kStagePrefix);
  const std::string where = stage.empty() || stage == "loading"
                                ? std::string("while being loaded (its constructors run then)")
                                : "in " + stage;
  std::string reason;
  if (end.timed_out) {
    reason = fmt::format("did not return within {} s {} (vetted in a child process, killed)",
                         std::chrono::duration<double>(timeout).count(), where);
  } else if (end.signal != 0) {
    reason = fmt::format("crashed with {} {} (vetted in a child process)",
                         signal_description(end.signal), where);
  } else {
    reason = fmt::format("ended the process with exit status {} {} (vetted in a child process)",
                         end.exit_code, where);
  }
  std::string tail = end.output_tail;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  if (const auto nl = tail.rfind('\n'); nl != std::string::npos) tail.erase(0, nl + 1);
  if (!tail.empty()) reason += fmt::format("; its last output: '{}'", tail);
  return reason;
}

// The last complete line of `text` ("" when none).
std::string last_line(const std::string& text) {
  const auto end = text.rfind('\n');
  if (end == std::string::npos) return {};
  const auto start = text.rfind('\n', end == 0 ? 0 : end - 1);
  return start == std::string::npos || end == 0 ? text.substr(0, end)
                                                : text.substr(start + 1, end - start - 1);
}

void warn_once(const std::string& text) {
  static std::once_flag once;
  std::call_once(once, [&] { logger("registry")->warn("{}", text); });
}

// Starts the helper on one file; the child's pid and its pipes, or nullopt with *why.
std::optional<Child> spawn_helper(const fs::path& helper, const fs::path& plugin, std::string* why) {
  int report[2] = {-1, -1};
  int output[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0 || ::pipe2(output, O_CLOEXEC) != 0) {
    *why = fmt::format("pipe: {}", std::strerror(errno));
    for (int fd : {report[0], report[1], output[0], output[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return std::nullopt;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, report[1], kReportFd);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const std::string helper_text = helper.string();
  const std::string plugin_text = plugin.string();
  char* argv[] = {const_cast<char*>(helper_text.c_str()), const_cast<char*>(plugin_text.c_str()),
                  nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, helper_text.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(report[1]);
  ::close(output[1]);
  if (rc != 0) {
    ::close(report[0]);
    ::close(output[0]);
    *why = fmt::format("cannot start {}: {}", helper_text, std::strerror(rc));
    return std::nullopt;
  }
  return Child{pid, report[0], output[0]};
}

}  // namespace

std::chrono::milliseconds vet_timeout() {
  if (const char* text = std::getenv("FERRY_PLUGIN_VET_TIMEOUT_S")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    if (end != text && *end == '\0' && seconds > 0 && seconds < 3600) {
      return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
    }
    warn_once(fmt::format("FERRY_PLUGIN_VET_TIMEOUT_S='{}' is not a number of seconds in (0, "
                          "3600); using 10",
                          text));
  }
  return std::chrono::seconds(10);
}

std::optional<fs::path> vet_helper() {
  return find_program({fs::path(FERRY_LIBEXECDIR) / "ferry" / FERRY_VET_HELPER_NAME,
                       FERRY_VET_HELPER_BUILD});
}

std::vector<std::optional<std::string>> vet_in_children(const std::vector<VetRequest>& requests) {
  std::vector<std::optional<std::string>> verdicts(requests.size());
  std::vector<std::optional<FileKey>> keys(requests.size());
  std::vector<std::size_t> todo;
  {
    std::lock_guard lock(cache_mutex());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      keys[i] = file_key(requests[i].path);
      if (keys[i]) {
        if (auto it = cache().find(*keys[i]); it != cache().end()) {
          verdicts[i] = it->second;
          continue;
        }
      }
      todo.push_back(i);
    }
  }
  if (todo.empty()) return verdicts;
  const auto helper = vet_helper();
  if (!helper) {
    warn_once(fmt::format(
        "plugins are loaded without vetting them in a child process first: the helper {} was "
        "not found (installed at {}); a plugin that crashes while loading takes this process "
        "with it",
        FERRY_VET_HELPER_NAME, FERRY_VET_HELPER_INSTALL));
    return verdicts;
  }
  const auto timeout = vet_timeout();
  std::vector<Child> children;
  std::vector<std::size_t> started;
  for (std::size_t i : todo) {
    std::string why;
    auto child = spawn_helper(*helper, requests[i].path, &why);
    if (!child) {
      warn_once("plugins are loaded without vetting them in a child process first: " + why);
      continue;
    }
    children.push_back(*child);
    started.push_back(i);
  }
  const auto ends = await_children(children, std::chrono::steady_clock::now() + timeout);
  std::lock_guard lock(cache_mutex());
  for (std::size_t k = 0; k < started.size(); ++k) {
    const std::size_t i = started[k];
    const ChildEnd& end = ends[k];
    const std::string last = last_line(end.report);
    if (last == kAcceptedLine) {
      verdicts[i] = std::nullopt;
    } else if (last.rfind(kRefusedPrefix, 0) == 0) {
      verdicts[i] = last.substr(std::string(kRefusedPrefix).size());
    } else {
      verdicts[i] = unfinished_reason(end, timeout);
    }
    if (keys[i]) cache()[*keys[i]] = verdicts[i];
  }
  return verdicts;
}

}  // namespace ferry::registry
