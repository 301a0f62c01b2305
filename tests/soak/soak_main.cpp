// tests/soak/soak_main.cpp: `ferry_soak`, the long-running check that one `ferry serve` process
// stays flat over many updates: for each data path (disk: /update_weights_from_disk alternating
// two checkpoints; inline: an in-process session::Sender over the session socket, kept sessions,
// a new Sender and so a new session every 50 updates; ucx: the same over the ucx plugin, when it
// is built) and each model (a tiny one and a ~300 MB one) it runs N updates into one receiver,
// checks the published version after every update and the fingerprints against the checkpoint
// just pushed every 100, and samples the receiver's (and this process's, the sender's) resident
// memory, open file descriptors and threads after a warm-up and at the end. Any growth beyond the
// tolerance, any wrong version or fingerprint, any failed update or any "[error]" line in the
// receiver's log fails the run. The table is printed, and written as JSON, either way.
// Run by scripts/soak (docs/soak.md); environment: FERRY_EXE (the `ferry` executable), and
// FERRY_UCX_PLUGIN (the ucx plugin's file; the ucx path is skipped, saying so, without it).
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- what is measured ------------------------------------------------------------------------

struct Sample {
  std::uint64_t rss_bytes = 0;          // VmRSS of /proc/PID/status
  std::uint64_t fds = 0;                // entries of /proc/PID/fd
  std::uint64_t threads = 0;            // entries of /proc/PID/task
  std::vector<std::string> fd_targets;  // what each descriptor is (readlink), sorted
};

// The growth each metric may show between the warm-up sample and the end (docs/soak.md).
constexpr std::uint64_t kRssTolerance = 32ull << 20;
constexpr std::uint64_t kFdTolerance = 4;
constexpr std::uint64_t kThreadTolerance = 2;

std::vector<std::string> entries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw std::runtime_error("cannot list " + dir + " (is the process gone?)");
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

// What the descriptor is: a path, "socket:[inode]", "pipe:[inode]", "anon_inode:[eventpoll]".
// Inode numbers are dropped, so that two samples compare by kind.
std::string fd_target(const std::string& link) {
  std::error_code ec;
  std::string target = std::filesystem::read_symlink(link, ec).string();
  if (ec) return "(closed while listed)";
  if (const auto at = target.find(":["); at != std::string::npos && target.rfind("anon_", 0) != 0) {
    target.resize(at);
  }
  return target;
}

std::uint64_t vm_rss(pid_t pid) {
  const std::string path = fmt::format("/proc/{}/status", pid);
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::uint64_t kib = 0;
      fields >> kib;
      return kib << 10;
    }
  }
  throw std::runtime_error("no VmRSS line in " + path + " (is the process gone?)");
}

// One reading of the process's counts (for this process, the listing's own descriptor is
// counted in every reading alike).
Sample read_counts(pid_t pid) {
  Sample s;
  s.rss_bytes = vm_rss(pid);
  const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
  for (const auto& fd : entries(fd_dir)) s.fd_targets.push_back(fd_target(fd_dir + "/" + fd));
  std::sort(s.fd_targets.begin(), s.fd_targets.end());
  s.fds = s.fd_targets.size();
  s.threads = entries(fmt::format("/proc/{}/task", pid)).size();
  return s;
}

// The sample: the smallest of kReadings readings 100 ms apart, metric by metric. Work that ends
// shortly after a commit (a background mirror refresh; a session that ended, whose UCX data path
// takes up to a second to close) is not counted, while anything kept stays in every reading.
constexpr int kReadings = 12;
Sample sample_of(pid_t pid) {
  Sample best = read_counts(pid);
  for (int i = 1; i < kReadings; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Sample s = read_counts(pid);
    best.rss_bytes = std::min(best.rss_bytes, s.rss_bytes);
    best.threads = std::min(best.threads, s.threads);
    if (s.fds < best.fds) {
      best.fds = s.fds;
      best.fd_targets = std::move(s.fd_targets);
    }
  }
  return best;
}

// What grew beyond its tolerance between `warm` and `end`, one message per metric.
std::vector<std::string> growth_errors(const char* who, const std::optional<Sample>& warm,
                                       const std::optional<Sample>& end) {
  std::vector<std::string> errors;
  if (!warm || !end) return errors;
  if (end->rss_bytes > warm->rss_bytes + kRssTolerance) {
    errors.push_back(fmt::format("{} RSS grew {:.1f} MiB (limit {} MiB)", who,
                                 (end->rss_bytes - warm->rss_bytes) / 1048576.0,
                                 kRssTolerance >> 20));
  }
  if (end->fds > warm->fds + kFdTolerance) {
    std::vector<std::string> added;
    std::set_difference(end->fd_targets.begin(), end->fd_targets.end(), warm->fd_targets.begin(),
                        warm->fd_targets.end(), std::back_inserter(added));
    errors.push_back(fmt::format("{} open fds grew by {} (limit {}); new: {}", who,
                                 end->fds - warm->fds, kFdTolerance, fmt::join(added, ", ")));
  }
  if (end->threads > warm->threads + kThreadTolerance) {
    errors.push_back(fmt::format("{} threads grew by {} (limit {})", who,
                                 end->threads - warm->threads, kThreadTolerance));
  }
  return errors;
}

// ---- the models --------------------------------------------------------------------------------

// Two versions of one model written as checkpoints a/ and b/, with the fingerprints the receiver
// must report for each.
struct Model {
  std::string name;
  DenseShape shape;
  std::uint64_t bucket_bytes = 0;  // of the session pushes
  TempDir dir;
  Checkpoint a, b;
  std::map<std::string, std::string> prints_a, prints_b;

  Model(std::string model_name, DenseShape model_shape, std::uint64_t bucket)
      : name(std::move(model_name)), shape(model_shape), bucket_bytes(bucket) {
    auto f32 = [](const std::string&) { return FERRY_DTYPE_F32; };
    a = make_dense_checkpoint(shape, f32, 101);
    b = make_dense_checkpoint(shape, f32, 202);
    write_checkpoint(dir.path() / "a", a, 1);
    write_checkpoint(dir.path() / "b", b, 2);
    prints_a = expected_fingerprints(a, 0, 1);
    prints_b = expected_fingerprints(b, 0, 1);
  }
  std::string path_a() const { return (dir.path() / "a").string(); }
  std::string path_b() const { return (dir.path() / "b").string(); }
  // Update i (1-based) carries b when i is odd, a when even (the receiver starts from a).
  bool b_at(unsigned i) const { return i % 2 == 1; }
};

DenseShape small_shape() {
  return DenseShape{};
}

// Hidden 1024, vocab 16384, 3 layers, all F32: 302 MiB.
DenseShape large_shape() {
  return DenseShape{.vocab = 16384,
                    .hidden = 1024,
                    .q_rows = 1024,
                    .kv_rows = 256,
                    .head_dim = 128,
                    .intermediate = 4096,
                    .layers = 3,
                    .lm_head = true};
}

// ---- one run: N updates into one receiver -------------------------------------------------------

struct RunSpec {
  std::string path;  // disk, inline, ucx
  const Model* model = nullptr;
  unsigned updates = 0;
  unsigned warmup = 0;  // the first sample is taken after this update
  bool trace = false;
  std::string receiver_log;  // the receiver's --log-level; its log is kept as soak-PATH-MODEL.log
};

struct RunResult {
  RunSpec spec;
  unsigned done = 0;          // updates committed and verified
  double seconds = 0;         // the whole run: start, updates, checks, samples, stop
  double update_seconds = 0;  // the updates alone (request or push to commit)
  std::optional<Sample> receiver_warm, receiver_end, sender_warm, sender_end;
  std::vector<std::string> errors;
  bool ok() const { return errors.empty(); }
};

constexpr unsigned kNewSessionEvery = 50;
constexpr auto kSettle = std::chrono::milliseconds(1500);
constexpr auto kSettleLimit = std::chrono::seconds(60);
constexpr unsigned kFingerprintEvery = 100;

class Run {
 public:
  Run(RunSpec spec, const std::string& ucx_dir) : spec_(std::move(spec)), ucx_dir_(ucx_dir) {
    result_.spec = spec_;
  }

  RunResult go() {
    const Model& m = *spec_.model;
    ServeOptions options = receiver_options(m.path_a(), 0, 1, 60000);
    if (spec_.path == "ucx") options.env["UCX_TLS"] = ucx_tls();
    if (!spec_.receiver_log.empty()) options.log_level = spec_.receiver_log;
    const auto started = Clock::now();
    Clock::duration updating{};
    try {
      ServeProcess serve(options);
      expect_version(serve, 1, 0);
      if (spec_.trace) trace(serve.pid(), 0);
      for (unsigned i = 1; i <= spec_.updates; ++i) {
        const auto before = Clock::now();
        update(serve, i);
        updating += Clock::now() - before;
        expect_version(serve, 1 + i, i);
        if (i % kFingerprintEvery == 0 || i == spec_.updates) expect_prints(serve, i);
        result_.done = i;
        if (spec_.trace) trace(serve.pid(), i);
        // Once, half-way through the warm-up, the receiver is left idle until the background
        // copy into the host mirror (which runs to its end only when no update pre-empts it) has
        // copied this version whole: its memory reaches its high-water mark before the first
        // sample, not between the samples.
        if (i == spec_.warmup / 2) settle(serve, 1 + i);
        if (i == spec_.warmup) {
          result_.receiver_warm = sample_of(serve.pid());
          result_.sender_warm = sample_of(::getpid());
        }
      }
      result_.receiver_end = sample_of(serve.pid());
      result_.sender_end = sample_of(::getpid());
      sender_.reset();  // the kept session ends before the receiver does
      check_log(serve);
      if (!spec_.receiver_log.empty()) {
        std::ofstream(fmt::format("soak-{}-{}.log", spec_.path, m.name)) << serve.log();
      }
    } catch (const std::exception& e) {
      result_.errors.push_back(e.what());
    }
    sender_.reset();
    result_.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    result_.update_seconds = std::chrono::duration<double>(updating).count();
    check_growth();
    return result_;
  }

 private:
  // --trace: the receiver's counts after every update, without waiting (to see when they move).
  static void trace(pid_t pid, unsigned i) {
    const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
    std::ifstream status(fmt::format("/proc/{}/status", pid));
    std::string line, rss;
    while (std::getline(status, line)) {
      if (line.rfind("Rss", 0) == 0) rss += " " + line.substr(0, line.find(" kB"));
    }
    std::cout << fmt::format("  update {}: fds {}, threads {},{}\n", i, entries(fd_dir).size(),
                             entries(fmt::format("/proc/{}/task", pid)).size(), rss);
  }

  static std::string ucx_tls() {
    const char* tls = std::getenv("UCX_TLS");
    return tls != nullptr ? tls : "tcp";
  }

  void update(ServeProcess& serve, unsigned i) {
    const Model& m = *spec_.model;
    if (spec_.path == "disk") {
      const Reply r = serve.update_from_disk(m.b_at(i) ? m.path_b() : m.path_a());
      if (r.status != 200 || !r.body.value("success", false)) {
        throw std::runtime_error(
            fmt::format("update {} from disk: HTTP {}: {}", i, r.status, r.text));
      }
      return;
    }
    const bool fresh = (i - 1) % kNewSessionEvery == 0;
    const auto t0 = Clock::now();
    if (sender_ == nullptr || fresh) {
      sender_.reset();
      sender_ = make_sender(address_of(serve));
    }
    const auto t1 = Clock::now();
    const auto views = views_of(m.b_at(i) ? m.b : m.a);
    const auto report = sender_->push(views, 1 + i);
    if (spec_.trace && fresh) {
      std::cout << fmt::format(
          "  update {}: old Sender closed and new one made in {:.3f} s, its "
          "first push (a new session) took {:.3f} s\n",
          i, std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(Clock::now() - t1).count());
    }
    if (report.receivers.size() != 1) throw std::runtime_error("push: not one receiver reported");
    const auto& r = report.receivers[0];
    if (!r.committed) throw std::runtime_error(fmt::format("push {}: {}", i, r.error));
    if (r.transport != spec_.path) {
      throw std::runtime_error(
          fmt::format("push {} went via '{}', not '{}'", i, r.transport, spec_.path));
    }
    // The first push of each Sender opens a session; every other one reuses the kept one.
    if (r.reused_session == fresh) {
      throw std::runtime_error(
          fmt::format("push {} {} the kept session", i, fresh ? "reused" : "did not reuse"));
    }
  }

  std::unique_ptr<session::Sender> make_sender(const std::string& address) {
    session::SenderOptions o;
    o.receivers = {address};
    o.transport = spec_.path;
    o.bucket_bytes = spec_.model->bucket_bytes;
    o.keep_sessions = true;
    o.bucket_timeout = std::chrono::milliseconds(60000);
    o.commit_timeout = std::chrono::milliseconds(60000);
    o.threads = 1;
    if (registry_ == nullptr) {
      std::vector<std::filesystem::path> dirs;
      if (spec_.path == "ucx") dirs.push_back(ucx_dir_);
      registry_ = std::make_unique<registry::Registry>(dirs);
    }
    return std::make_unique<session::Sender>(config_, *registry_, o);
  }

  // Waits until /metrics says the host mirror holds `version` whole (ferry_mirror_version), at
  // least kSettle; fails after kSettleLimit. A receiver without the metric is left idle kSettle.
  static void settle(const ServeProcess& serve, long long version) {
    const auto start = Clock::now();
    const std::string want = fmt::format("\nferry_mirror_version {}\n", version);
    std::string last = "(no /metrics answer)";
    while (Clock::now() - start < kSettleLimit) {
      const Reply r = serve.get("/metrics");
      if (r.status == 200) {
        if (r.text.find("\nferry_mirror_version ") == std::string::npos) break;
        if (r.text.find(want) != std::string::npos) break;
        last = r.text.substr(r.text.find("\nferry_mirror_version ") + 1);
        last.resize(std::min(last.find('\n'), last.size()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (Clock::now() - start >= kSettleLimit) {
      throw std::runtime_error(fmt::format(
          "the idle receiver's host mirror did not copy version {} within {} s ({})", version,
          std::chrono::duration_cast<std::chrono::seconds>(kSettleLimit).count(), last));
    }
    std::this_thread::sleep_until(start + kSettle);
  }

  static void expect_version(const ServeProcess& serve, long long want, unsigned i) {
    const long long got = version_of(serve);
    if (got != want) {
      throw std::runtime_error(
          fmt::format("after update {}: version {}, expected {}", i, got, want));
    }
  }

  void expect_prints(const ServeProcess& serve, unsigned i) const {
    const Model& m = *spec_.model;
    const auto& want = m.b_at(i) ? m.prints_b : m.prints_a;
    const auto got = serve.fingerprints();
    if (got == want) return;
    std::string first = "(none answered)";
    for (const auto& [name, hex] : want) {
      const auto it = got.find(name);
      if (it == got.end() || it->second != hex) {
        first = fmt::format("{}: {} instead of {}", name, it == got.end() ? "missing" : it->second,
                            hex);
        break;
      }
    }
    throw std::runtime_error(
        fmt::format("after update {}: fingerprints differ from checkpoint {}"
                    " ({})",
                    i, m.b_at(i) ? "b" : "a", first));
  }

  void check_log(const ServeProcess& serve) {
    const std::string log = serve.log();
    std::istringstream lines(log);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find("[error]") != std::string::npos) {
        result_.errors.push_back("the receiver logged an error: " + line);
        return;
      }
    }
  }

  void check_growth() {
    for (auto& e : growth_errors("receiver", result_.receiver_warm, result_.receiver_end)) {
      result_.errors.push_back(std::move(e));
    }
    for (auto& e : growth_errors("sender", result_.sender_warm, result_.sender_end)) {
      result_.errors.push_back(std::move(e));
    }
  }

  RunSpec spec_;
  std::string ucx_dir_;
  RunResult result_;
  config::Config config_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<session::Sender> sender_;
};

// ---- report
// --------------------------------------------------------------------------------------

json sample_json(const std::optional<Sample>& s) {
  if (!s) return nullptr;
  return json{{"rss_bytes", s->rss_bytes}, {"fds", s->fds}, {"threads", s->threads}};
}

json result_json(const RunResult& r) {
  return json{
      {"path", r.spec.path},
      {"model", r.spec.model->name},
      {"model_bytes", r.spec.model->a.total_bytes()},
      {"updates", r.spec.updates},
      {"updates_done", r.done},
      {"warmup", r.spec.warmup},
      {"seconds", r.seconds},
      {"update_seconds", r.update_seconds},
      {"receiver", {{"warm", sample_json(r.receiver_warm)}, {"end", sample_json(r.receiver_end)}}},
      {"sender", {{"warm", sample_json(r.sender_warm)}, {"end", sample_json(r.sender_end)}}},
      {"ok", r.ok()},
      {"errors", r.errors}};
}

void print_table(const std::vector<RunResult>& results) {
  std::cout << fmt::format("{:<7} {:<6} {:>9} {:>9}  {:<8} {:>14} {:>14} {:>14}  {}\n", "path",
                           "model", "updates", "ms/update", "process", "RSS MiB", "fds", "threads",
                           "verdict");
  auto cell = [](double warm, double end, const char* format) {
    return fmt::format(fmt::runtime(format), warm, end);
  };
  for (const auto& r : results) {
    const double ms = r.done > 0 ? r.update_seconds * 1000 / r.done : 0;
    auto row = [&](const char* who, const std::optional<Sample>& w, const std::optional<Sample>& e,
                   const std::string& verdict) {
      std::string rss = "-", fds = "-", threads = "-";
      if (w && e) {
        rss = cell(w->rss_bytes / 1048576.0, e->rss_bytes / 1048576.0, "{:.1f}->{:.1f}");
        fds = cell(double(w->fds), double(e->fds), "{:.0f}->{:.0f}");
        threads = cell(double(w->threads), double(e->threads), "{:.0f}->{:.0f}");
      }
      std::cout << fmt::format("{:<7} {:<6} {:>9} {:>9.1f}  {:<8} {:>14} {:>14} {:>14}  {}\n",
                               r.spec.path, r.spec.model->name,
                               fmt::format("{}/{}", r.done, r.spec.updates), ms, who, rss, fds,
                               threads, verdict);
    };
    row("receiver", r.receiver_warm, r.receiver_end, r.ok() ? "ok" : "FAILED");
    row("sender", r.sender_warm, r.sender_end, "");
    for (const auto& e : r.errors) std::cout << "    " << e << "\n";
  }
  std::cout << fmt::format(
      "(samples after update warm-up -> end; limits: RSS +{} MiB, fds +{}, threads +{})\n",
      kRssTolerance >> 20, kFdTolerance, kThreadTolerance);
}

// ---- command line ------------------------------------------------------------------------------

struct Args {
  unsigned updates = 1000;       // per path, small model
  unsigned large_updates = 200;  // per path, ~300 MB model (1000 would take 11 minutes here)
  unsigned warmup = 50;
  unsigned large_warmup = 50;
  std::vector<std::string> paths = {"disk", "inline", "ucx"};
  std::vector<std::string> models = {"small", "large"};
  std::string json_path = "soak.json";
  bool trace = false;
  std::string receiver_log;
  bool self_test = false;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

unsigned positive(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  unsigned long value = 0;
  try {
    value = std::stoul(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value == 0 || value > 1000000) {
    throw std::invalid_argument(flag + " wants a whole number from 1 to 1000000, not '" + text +
                                "'");
  }
  return static_cast<unsigned>(value);
}

const char* const kUsage =
    "usage: ferry_soak [--updates N] [--warmup N] [--large-updates N] [--large-warmup N]\n"
    "                  [--paths disk,inline,ucx] [--models small,large] [--json FILE]\n"
    "                  [--trace]   (the receiver's counts after every update)\n"
    "                  [--receiver-log LEVEL]   (kept as soak-PATH-MODEL.log, here)\n"
    "       ferry_soak --self-test   (the growth checks catch growth of this process)\n";

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--self-test") {
      a.self_test = true;
      continue;
    }
    if (flag == "--trace") {
      a.trace = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (or is unknown)");
    const std::string value = argv[++i];
    if (flag == "--updates")
      a.updates = positive(flag, value);
    else if (flag == "--warmup")
      a.warmup = positive(flag, value);
    else if (flag == "--large-updates")
      a.large_updates = positive(flag, value);
    else if (flag == "--large-warmup")
      a.large_warmup = positive(flag, value);
    else if (flag == "--paths")
      a.paths = split(value);
    else if (flag == "--models")
      a.models = split(value);
    else if (flag == "--json")
      a.json_path = value;
    else if (flag == "--receiver-log")
      a.receiver_log = value;
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  for (const auto& p : a.paths) {
    if (p != "disk" && p != "inline" && p != "ucx") {
      throw std::invalid_argument("--paths: unknown path '" + p + "' (disk, inline, ucx)");
    }
  }
  for (const auto& m : a.models) {
    if (m != "small" && m != "large") {
      throw std::invalid_argument("--models: unknown model '" + m + "' (small, large)");
    }
  }
  if (a.warmup >= a.updates || a.large_warmup >= a.large_updates) {
    throw std::invalid_argument("a warm-up must end before the last update");
  }
  return a;
}

// --self-test: the measurement itself, on this process: after a sample, 8 descriptors, 48 MiB
// written and 4 threads more must each be reported as growth, and no growth without them.
int self_test() {
  const pid_t self = ::getpid();
  const auto warm = sample_of(self);
  const auto still = sample_of(self);
  int status = 0;
  if (const auto errors = growth_errors("self", warm, still); !errors.empty()) {
    std::cout << "ferry_soak --self-test: growth reported with nothing added: " << errors[0]
              << "\n";
    status = 1;
  }
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) fds.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<char> bytes(48u << 20);
  for (std::size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = 1;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&stop] {
      while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    });
  }
  const auto end = sample_of(self);
  stop.store(true);
  for (auto& t : threads) t.join();
  for (int fd : fds) ::close(fd);
  const auto errors = growth_errors("self", warm, end);
  for (const char* metric : {"RSS grew", "open fds grew", "threads grew"}) {
    const bool found = std::any_of(errors.begin(), errors.end(), [&](const std::string& e) {
      return e.find(metric) != std::string::npos;
    });
    if (!found) {
      std::cout << "ferry_soak --self-test: '" << metric << "' was not reported\n";
      status = 1;
    }
  }
  for (const auto& e : errors) std::cout << "ferry_soak --self-test: reported: " << e << "\n";
  const volatile char touched = bytes[4096];  // the pages were written, and are kept till here
  (void)touched;
  std::cout << "ferry_soak --self-test: " << (status == 0 ? "passed" : "FAILED") << "\n";
  return status;
}

int soak(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (args.self_test) return self_test();
  set_log_level("warn");  // the sender's per-session info lines would drown the table
  (void)required_env("FERRY_EXE");
  std::string ucx_dir;
  if (const char* plugin = std::getenv("FERRY_UCX_PLUGIN");
      plugin != nullptr && std::filesystem::exists(plugin)) {
    ucx_dir = std::filesystem::path(plugin).parent_path().string();
    ::setenv("UCX_TLS", std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : "tcp", 1);
  }

  std::vector<std::unique_ptr<Model>> models;
  for (const auto& name : args.models) {
    const auto t0 = Clock::now();
    if (name == "small")
      models.push_back(std::make_unique<Model>(name, small_shape(), 4096));
    else
      models.push_back(std::make_unique<Model>(name, large_shape(), 64ull << 20));
    std::cout << fmt::format("ferry_soak: model {} ({:.1f} MiB) written in {:.1f} s\n", name,
                             models.back()->a.total_bytes() / 1048576.0,
                             std::chrono::duration<double>(Clock::now() - t0).count())
              << std::flush;
  }

  std::vector<RunResult> results;
  std::vector<std::string> skipped;
  for (const auto& model : models) {
    for (const auto& path : args.paths) {
      if (path == "ucx" && ucx_dir.empty()) {
        skipped.push_back(
            fmt::format("ucx/{}: skipped, the ucx plugin is not built "
                        "(FERRY_UCX_PLUGIN names no file)",
                        model->name));
        continue;
      }
      RunSpec spec;
      spec.path = path;
      spec.model = model.get();
      spec.trace = args.trace;
      spec.receiver_log = args.receiver_log;
      spec.updates = model->name == "small" ? args.updates : args.large_updates;
      spec.warmup = model->name == "small" ? args.warmup : args.large_warmup;
      std::cout << fmt::format("ferry_soak: {} x {} over {}...\n", spec.updates, model->name, path)
                << std::flush;
      results.push_back(Run(spec, ucx_dir).go());
      const auto& r = results.back();
      std::cout << fmt::format("ferry_soak: {} {}: {} in {:.1f} s\n", path, model->name,
                               r.ok() ? "ok" : "FAILED", r.seconds)
                << std::flush;
    }
  }

  print_table(results);
  for (const auto& s : skipped) std::cout << s << "\n";
  bool ok = !results.empty();
  json out{{"tolerance",
            {{"rss_bytes", kRssTolerance}, {"fds", kFdTolerance}, {"threads", kThreadTolerance}}},
           {"runs", json::array()},
           {"skipped", skipped}};
  for (const auto& r : results) {
    out["runs"].push_back(result_json(r));
    ok = ok && r.ok();
  }
  out["ok"] = ok;
  std::ofstream(args.json_path) << out.dump(2) << "\n";
  std::cout << fmt::format("ferry_soak: {} (JSON: {})\n", ok ? "passed" : "FAILED", args.json_path);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ferry::test

int main(int argc, char** argv) {
  try {
    return ferry::test::soak(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "ferry_soak: " << e.what() << "\n" << ferry::test::kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ferry_soak: " << e.what() << "\n";
    return 1;
  }
}
