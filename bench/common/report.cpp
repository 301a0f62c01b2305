// bench/common/report.cpp: statistics, machine description, records, table printing and the
// watchdog shared by the `ferry bench` cases (report.hpp).
#include "bench/common/report.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include "bench/common/cuda.hpp"
#endif

namespace ferry::bench {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "";
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  std::string arg;
  auto flush_arg = [&] {
    if (!out.empty()) out += ' ';
    const bool quote = arg.empty() || arg.find_first_of(" \t\"'$") != std::string::npos;
    out += quote ? "'" + arg + "'" : arg;
    arg.clear();
  };
  for (char c : raw) {
    if (c == '\0') {
      flush_arg();
    } else {
      arg += c;
    }
  }
  if (!arg.empty()) flush_arg();
  return out;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Watchdog state: one watchdog per process.
std::atomic<const char*> g_phase{"starting"};
std::atomic<pid_t> g_child{0};
std::atomic<std::int64_t> g_deadline_ns{0};  // steady_clock; 0: no watchdog

std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct WatchdogThread {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};
WatchdogThread* g_watchdog = nullptr;

}  // namespace

const char* device_name(Device device) noexcept { return device == Device::cuda ? "cuda" : "cpu"; }

double median(std::vector<double> runs) {
  if (runs.empty()) return 0;
  std::sort(runs.begin(), runs.end());
  const std::size_t n = runs.size();
  return n % 2 == 1 ? runs[n / 2] : (runs[n / 2 - 1] + runs[n / 2]) / 2;
}

std::string decimal_bytes(double bytes) {
  if (bytes >= 1e12) return fmt::format("{:.2f} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

std::string binary_size(std::uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

std::string number(std::optional<double> value, int digits) {
  if (!value) return "-";
  return fmt::format("{:.{}f}", *value, digits);
}

Json machine_description(Device device) {
  Json machine;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) machine["host"] = host;
  machine["cpu"] = cpu_model();
  machine["cpus"] = std::thread::hardware_concurrency();
#if FERRY_HAVE_CUDA
  if (device == Device::cuda) machine["gpu"] = gpu_description();
#else
  (void)device;
#endif
  return machine;
}

Json record_header(const std::string& bench, const std::string& case_name, Device device) {
  Json record;
  record["bench"] = bench;
  record["case"] = case_name;
  record["device"] = device_name(device);
  record["command"] = command_line();
  record["timestamp"] = utc_timestamp();
  record["ferry_version"] = FERRY_VERSION;
  record["machine"] = machine_description(device);
  return record;
}

void write_records(const std::string& path, const Json& records) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) fail(FERRY_STATUS_IO, "cannot open the bench JSON file '{}' for writing", path);
  out << records.dump(2) << '\n';
  out.close();
  if (!out) fail(FERRY_STATUS_IO, "writing the bench JSON file '{}' failed", path);
}

Table::Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void Table::print() const {
  std::vector<std::size_t> width(headers_.size());
  for (std::size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) line += "  ";
      line += c == 0 ? fmt::format("{:<{}}", cells[c], width[c])
                     : fmt::format("{:>{}}", cells[c], width[c]);
    }
    std::printf("%s\n", line.c_str());
  };
  print_row(headers_);
  std::size_t total = 0;
  for (std::size_t w : width) total += w + 2;
  std::printf("%s\n", std::string(total > 2 ? total - 2 : 0, '-').c_str());
  for (const auto& row : rows_) print_row(row);
  std::fflush(stdout);
}

Watchdog::Watchdog(int seconds) {
  if (seconds <= 0 || g_watchdog != nullptr) return;
  g_deadline_ns = steady_now_ns() + static_cast<std::int64_t>(seconds) * 1'000'000'000;
  g_watchdog = new WatchdogThread;
  WatchdogThread* state = g_watchdog;
  state->thread = std::thread([state, seconds] {
    std::unique_lock lock(state->mutex);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    if (state->wake.wait_until(lock, until, [state] { return state->stop; })) return;
    // Async-signal-safety is not needed here (an ordinary thread), but nothing may block: the
    // main thread may be stuck inside a CUDA call holding locks of its own.
    std::fprintf(stderr,
                 "ferry bench: error: gave up after %d s (--timeout) while %s; nothing was "
                 "written to --json\n",
                 seconds, g_phase.load());
    std::fflush(stderr);
    const pid_t child = g_child.load();
    if (child > 0) kill(child, SIGKILL);
    std::_Exit(3);
  });
}

Watchdog::~Watchdog() {
  if (g_watchdog == nullptr) return;
  {
    std::lock_guard lock(g_watchdog->mutex);
    g_watchdog->stop = true;
  }
  g_watchdog->wake.notify_all();
  g_watchdog->thread.join();
  delete g_watchdog;
  g_watchdog = nullptr;
  g_deadline_ns = 0;
}

void Watchdog::phase(const char* what) noexcept { g_phase = what; }

void Watchdog::set_child(pid_t pid) noexcept { g_child = pid; }

double Watchdog::seconds_left() noexcept {
  const std::int64_t deadline = g_deadline_ns.load();
  if (deadline == 0) return 1e9;
  return static_cast<double>(deadline - steady_now_ns()) / 1e9;
}

}  // namespace ferry::bench
