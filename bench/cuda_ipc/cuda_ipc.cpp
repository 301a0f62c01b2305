// bench/cuda_ipc/cuda_ipc.cpp: `ferry bench cuda_ipc` (see cuda_ipc.hpp): per tensor count, per
// mode a fresh `ferry serve` child updated by a Sender (first push apart, then timed pushes of new
// weights, each committed), verified by the receiver's fingerprints, then the copy ceiling, then
// the torch.multiprocessing baselines in a child process; then the table and the records.
#include "bench/cuda_ipc/cuda_ipc.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "bench/common/baseline.hpp"
#include "bench/common/data.hpp"
#include "bench/common/ferry_program.hpp"
#include "cli/context.hpp"
#include "common/log.hpp"
#include "demo/receiver_process.hpp"
#include "registry/registry.hpp"
#include "order/stream_order.hpp"
#include "session/sender/sender.hpp"
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

constexpr double kTarget = 0.70;  // PERF.md: >= 70% of the D2D ceiling, whatever the count
constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kRowElements = 1024;  // tensors are [rows, 1024] bf16
constexpr std::uint64_t kDeviceBucketBytes = 512ull << 20;

// ---- host tensors (the CPU check of the bench)

class HostTensors final : public SenderTensors {
 public:
  HostTensors(std::size_t count, std::uint64_t bytes) : bytes_(bytes) {
    for (std::size_t i = 0; i < count; ++i) {
      // Aligned like a device allocation; zeroed so the pages exist before any timing.
      buffers_.emplace_back(static_cast<std::byte*>(std::aligned_alloc(256, bytes)));
      if (!buffers_.back()) fail(FERRY_STATUS_OUT_OF_MEMORY, "bench cuda_ipc: host tensor {}", i);
      std::memset(buffers_.back().get(), 0, bytes);
    }
  }
  void fill(std::uint64_t seed) override {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      fill_pattern_cpu(buffers_[i].get(), bytes_, seed * 1'000'003ull + i);
    }
  }
  const void* data(std::size_t index) const override { return buffers_.at(index).get(); }
  std::uint64_t fingerprint(std::size_t index) const override {
    return kernels::fingerprint_cpu(buffers_.at(index).get(), bytes_);
  }
  ferry_memory_kind_t memory_kind() const override { return FERRY_MEMORY_HOST; }
  std::size_t count() const override { return buffers_.size(); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::uint64_t bytes_;
  std::vector<std::unique_ptr<std::byte, Free>> buffers_;
};

// ---- statistics of one way of moving the update

struct Timing {
  std::optional<double> first_s;  // the first call (imports, layout), when it has one
  std::vector<double> runs_s;     // the timed calls after it
  double median() const { return bench::median(runs_s); }
  double best() const { return runs_s.empty() ? 0 : *std::min_element(runs_s.begin(), runs_s.end()); }
  Json json() const {
    Json j = Json::object();
    if (first_s) j["first_seconds"] = *first_s;
    j["median_seconds"] = median();
    j["best_seconds"] = best();
    j["runs_seconds"] = runs_s;
    return j;
  }
};

struct FerryRun {
  std::string mode;        // as asked (staged, direct, auto)
  std::string transport;   // what the session reported it used
  bool direct = false;     // the session delivered directly (into the receiver's parameters)
  Timing timing;
  // --release-each-step: the receiver's release and resume before each timed push, and how
  // many timed pushes went through the session kept from the push before.
  Timing release, resume;
  int reused_sessions = 0;
  std::uint64_t buckets = 0;
  bool verified = false;
  std::string verification;  // what was checked, or what was wrong
};

struct CountResult {
  std::uint64_t tensors = 0;
  std::uint64_t tensor_bytes = 0;
  std::uint64_t total = 0;
  Timing ceiling;
  std::vector<FerryRun> ferry;
  Baseline torch;
  Timing torch_per_tensor, torch_bucket;
};

Timing torch_timing(const Baseline& b, const char* method) {
  Timing t;
  if (!b.available || !b.data.contains(method) || !b.data[method].is_object()) return t;
  const Json& m = b.data[method];
  if (m.contains("first_s") && m["first_s"].is_number()) t.first_s = m["first_s"].get<double>();
  if (m.contains("runs_s") && m["runs_s"].is_array()) {
    for (const auto& v : m["runs_s"]) {
      if (v.is_number()) t.runs_s.push_back(v.get<double>());
    }
  }
  return t;
}

bool gpu_present() {
#if FERRY_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// The delivery mode a run forces on the Sender (config update.delivery): "direct" (tensors
// written straight into the receiver's parameters; the receiver takes the fingerprints the
// writing copy computed), "direct-reread" (the same, and the receiver reads everything written
// back at commit: update.direct_verify = "reread"), "staged" (through its device slots) or
// "auto" (the session's choice).
config::Delivery delivery_of(const std::string& mode) {
  if (mode == "direct" || mode == "direct-reread") return config::Delivery::direct;
  if (mode == "staged") return config::Delivery::staged;
  if (mode == "auto") return config::Delivery::automatic;
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "bench cuda_ipc: unknown mode '{}' (direct, direct-reread, staged or auto)", mode);
}

// The arguments placed before "serve", so the receiver sees the same config and plugins.
std::vector<std::string> receiver_globals(const GlobalOptions& globals) {
  std::vector<std::string> out;
  if (!globals.config_path.empty()) out.insert(out.end(), {"--config", globals.config_path});
  for (const auto& s : globals.overrides) out.insert(out.end(), {"--set", s});
  for (const auto& d : globals.plugin_dirs) out.insert(out.end(), {"--plugin-dir", d});
  // No host backup of the weights (the torch baselines keep none either); no per-session logs.
  out.insert(out.end(), {"--set", "memory.weights_policy=discard"});
  const bool verbose = globals.log_level == "debug" || globals.log_level == "trace";
  out.insert(out.end(), {"--log-level", verbose ? globals.log_level : std::string("warn")});
  return out;
}

// "" when the receiver publishes `label` and reports exactly `expected` (name -> fingerprint);
// otherwise what differs.
std::string check_receiver(demo::ReceiverProcess& receiver, const std::string& label,
                           const std::map<std::string, std::uint64_t>& expected) {
  const demo::Answer v = receiver.get("/get_weight_version");
  if (v.status != 200 || !v.body.is_object()) {
    return fmt::format("GET /get_weight_version answered {}: {}", v.status, v.text.substr(0, 200));
  }
  if (v.body.value("weight_version", std::string()) != label) {
    return fmt::format("the receiver publishes version '{}', expected '{}'",
                       v.body.value("weight_version", std::string()), label);
  }
  const demo::Answer f = receiver.get("/get_fingerprints");
  if (f.status != 200 || !f.body.is_object() || !f.body.contains("fingerprints") ||
      !f.body["fingerprints"].is_object()) {
    return fmt::format("GET /get_fingerprints answered {}: {}", f.status, f.text.substr(0, 200));
  }
  const auto& reported = f.body["fingerprints"];
  std::size_t wrong = 0;
  std::string first;
  for (const auto& [name, value] : expected) {
    const std::string want = fmt::format("{:016x}", value);
    auto it = reported.find(name);
    const std::string got = it == reported.end() ? std::string("(missing)")
                            : it->is_string()    ? it->get<std::string>()
                                                 : it->dump();
    if (got != want) {
      if (wrong++ == 0) first = fmt::format("{} (receiver {}, sender {})", name, got, want);
    }
  }
  if (reported.size() != expected.size()) {
    return fmt::format("the receiver reports {} parameters, the sender pushed {}", reported.size(),
                       expected.size());
  }
  if (wrong > 0) {
    return fmt::format("{} of {} parameters differ from the sender's tensors, first {}", wrong,
                       expected.size(), first);
  }
  return "";
}

// The RL loop's step between two pushes (--release-each-step): the receiver releases its
// weights and KV cache, the trainer borrows that memory and writes its new weights (`version`),
// the receiver resumes. "" or what failed.
std::string release_train_resume(demo::ReceiverProcess& receiver, const CudaIpcBenchOptions& o,
                                 SenderTensors& tensors, std::uint64_t tensor_bytes,
                                 std::uint64_t version, FerryRun& run) {
  const nlohmann::json tags = {{"tags", {"weights", "kv_cache"}}};
  const auto timed_post = [&](const char* path, Timing& into) -> std::string {
    const auto t0 = std::chrono::steady_clock::now();
    const demo::Answer a = receiver.post(path, tags);
    into.runs_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (a.status != 200) return fmt::format("POST {} answered {}: {}", path, a.status, a.text);
    return "";
  };
  Watchdog::phase("cuda_ipc: the receiver releases its weights");
  if (auto why = timed_post("/release_memory_occupation", run.release); !why.empty()) return why;
  Watchdog::phase("cuda_ipc: the trainer's step");
#if FERRY_HAVE_CUDA
  if (o.device == "cuda") borrow_device_memory(tensor_bytes * tensors.count());
#else
  (void)o, (void)tensor_bytes;
#endif
  tensors.fill(version);  // the step's new weights
  Watchdog::phase("cuda_ipc: the receiver resumes");
  return timed_post("/resume_memory_occupation", run.resume);
}

// One mode: a fresh receiver, a Sender, 1 + repeat pushes of new weights.
FerryRun run_ferry(const GlobalOptions& globals, const config::Config& config,
                   const registry::Registry& registry, const CudaIpcBenchOptions& o,
                   const std::string& transport, const std::string& mode, SenderTensors& tensors,
                   std::uint64_t tensor_bytes, const fs::path& run_dir) {
  FerryRun run;
  run.mode = mode;
  const std::size_t count = tensors.count();
  std::vector<session::TensorView> views(count);
  for (std::size_t i = 0; i < count; ++i) {
    views[i].name = fmt::format("model.layers.{}.weight", i);
    views[i].dtype = FERRY_DTYPE_BF16;
    views[i].shape = {tensor_bytes / 2 / kRowElements, kRowElements};
    views[i].data = tensors.data(i);
    views[i].memory_kind = tensors.memory_kind();
    views[i].device = 0;
  }

  Watchdog::phase("cuda_ipc: starting the receiver (ferry serve)");
  demo::ReceiverOptions ro;
  ro.exe = require_ferry_program("ferry bench cuda_ipc starts a `ferry serve` child");
  ro.global_args = receiver_globals(globals);
  if (mode == "direct-reread") {
    ro.global_args.insert(ro.global_args.end(), {"--set", "update.direct_verify=reread"});
  }
  ro.serve_args = {"--device", o.device == "cuda" ? "cuda:0" : "cpu", "--model-family", "identity"};
  ro.run_dir = run_dir;
  ro.ready_deadline_s = 120;
  ro.request_deadline_s = 120;
  ro.token = config.receiver.token;
  demo::ReceiverProcess receiver(ro);

  session::SenderOptions so;
  so.receivers = {fmt::format("127.0.0.1:{}", receiver.port())};
  so.transport = transport;
  so.bucket_bytes = o.bucket_bytes;
  if (o.group_bytes > 0) so.fingerprinted_group_bytes = o.group_bytes;
  so.token = config.receiver.token;
  so.rejoin_after_release = !o.no_rejoin;
  config::Config sender_config = config;
  sender_config.update.delivery = delivery_of(mode);
  session::Sender sender(sender_config, registry, so);

  std::string label;
  for (int call = 0; call <= o.repeat; ++call) {
    const std::uint64_t version = static_cast<std::uint64_t>(call) + 1;
    if (call > 0 && o.release_each_step) {
      // The trainer's step (its new weights written too) runs while the engine's memory is
      // released, as in the colocated loop; the push follows the resume at once.
      const std::string why =
          release_train_resume(receiver, o, tensors, tensor_bytes, version, run);
      if (!why.empty()) {
        run.verification = fmt::format("before push {}: {}", version, why);
        return run;
      }
    } else {
      Watchdog::phase("cuda_ipc: writing new weights");
      tensors.fill(version);  // every update carries other bytes: a stale parameter shows
    }
    label = fmt::format("bench-{}", version);
    Watchdog::phase("cuda_ipc: push (ferry)");
    order::StreamOrder producers;
    if (o.producer_order == "none") producers.wait = order::Wait::none;
    const session::PushReport report = sender.push(views, version, label, producers);
    const session::ReceiverResult& r = report.receivers.at(0);
    if (!r.committed) {
      run.verification = fmt::format("push {} failed: {}", version, r.error);
      return run;
    }
    if (r.transport != transport) {
      run.transport = r.transport;
      run.verification = fmt::format("push {} went over '{}', not '{}'", version, r.transport,
                                     transport);
      return run;
    }
    if (delivery_of(mode) == config::Delivery::direct && !r.direct) {
      run.transport = r.transport;
      run.verification = fmt::format("push {} was not delivered directly", version);
      return run;
    }
    run.transport = r.transport;
    run.direct = r.direct;
    run.buckets = r.buckets;
    if (call == 0) {
      run.timing.first_s = report.seconds;
    } else {
      run.timing.runs_s.push_back(report.seconds);
      if (r.reused_session) ++run.reused_sessions;
    }
  }
  Watchdog::phase("cuda_ipc: verifying the receiver's weights");
  std::map<std::string, std::uint64_t> expected;
  for (std::size_t i = 0; i < count; ++i) expected[views[i].name] = tensors.fingerprint(i);
  const std::string why = check_receiver(receiver, label, expected);
  run.verified = why.empty();
  run.verification =
      run.verified ? fmt::format("after the last push the receiver publishes '{}' and each of its "
                                 "{} parameters has the sender's tensor's fingerprint",
                                 label, count)
                   : why;
  const std::string ended = receiver.stop();
  if (ended != "exited with status 0") logger("bench")->warn("the receiver {}", ended);
  return run;
}

std::string ms(std::optional<double> s) {
  return s && *s > 0 ? fmt::format("{:.1f}", *s * 1e3) : std::string("-");
}
std::string gbps(std::uint64_t bytes, double s) {
  return s > 0 ? fmt::format("{:.1f}", static_cast<double>(bytes) / s / 1e9) : std::string("-");
}
std::string ratio(double num_s, double den_s, const char* unit) {
  // Time ratio den/num as a speed ratio of num over den.
  return num_s > 0 && den_s > 0 ? fmt::format("{:.2f}{}", den_s / num_s, unit) : std::string("-");
}

void print_tables(const CudaIpcBenchOptions& o, const std::vector<CountResult>& results) {
  Table table({"tensors", "way", "first ms", "best ms", "median ms", "GB/s (median)", "of D2D",
               "verified"});
  for (const auto& c : results) {
    const double d2d = c.ceiling.median();
    auto row = [&](const std::string& way, const Timing& t, const std::string& verified) {
      table.add_row({std::to_string(c.tensors), way, ms(t.first_s), ms(t.best()), ms(t.median()),
                     gbps(c.total, t.median()), ratio(t.median(), d2d, ""), verified});
    };
    row(o.device == "cuda" ? "D2D copy ceiling" : "memcpy ceiling", c.ceiling, "yes");
    for (const auto& f : c.ferry) {
      row(fmt::format("ferry {} ({}{}){}", f.mode, f.transport.empty() ? "?" : f.transport,
                      f.mode == "auto" && f.direct ? ", direct" : "",
                      o.release_each_step
                          ? fmt::format(", after a release ({}/{} kept)", f.reused_sessions,
                                        f.timing.runs_s.size())
                          : std::string()),
          f.timing,
          f.verified ? "yes" : "FAILED");
    }
    if (c.torch.available) {
      const bool ok = c.torch.data.value("verified", false);
      row("torch per-tensor IPC", c.torch_per_tensor, ok ? "yes" : "FAILED");
      row("torch flat bucket IPC", c.torch_bucket, ok ? "yes" : "FAILED");
    }
  }
  std::printf("\n");
  table.print();

  Table ratios({"tensors", "ferry mode", "ferry / D2D (median)", "target >= 0.70",
                "vs torch per-tensor", "vs torch bucket", "first: vs per-tensor", "vs bucket"});
  for (const auto& c : results) {
    for (const auto& f : c.ferry) {
      const double fm = f.timing.median();
      const bool met = fm > 0 && c.ceiling.median() / fm >= kTarget;
      ratios.add_row({std::to_string(c.tensors), f.mode, ratio(fm, c.ceiling.median(), ""),
                      fm > 0 ? (met ? "met" : "NOT met") : "-",
                      ratio(fm, c.torch_per_tensor.median(), "x"),
                      ratio(fm, c.torch_bucket.median(), "x"),
                      ratio(f.timing.first_s.value_or(0), c.torch_per_tensor.first_s.value_or(0), "x"),
                      ratio(f.timing.first_s.value_or(0), c.torch_bucket.first_s.value_or(0), "x")});
    }
  }
  std::printf("\n");
  ratios.print();
  for (const auto& c : results) {
    if (!c.torch.available) {
      std::printf("torch baseline (%llu tensors): unavailable (%s)\n",
                  static_cast<unsigned long long>(c.tensors), c.torch.reason.c_str());
    }
  }
}

Json record_of(const CudaIpcBenchOptions& o, const CountResult& c, Device device) {
  Json r = record_header("cuda_ipc", fmt::format("{}-tensors", c.tensors), device);
  r["tensors"] = c.tensors;
  r["tensor_bytes"] = c.tensor_bytes;
  r["bytes"] = c.total;
  r["dtype"] = "bf16";
  r["repeat"] = o.repeat;
  r["bucket_bytes"] = o.bucket_bytes;
  r["group_bytes"] =
      o.group_bytes > 0 ? o.group_bytes : session::SenderOptions{}.fingerprinted_group_bytes;
  r["transport"] = o.transport;
  r["sender_memory"] = o.sender_memory;
  r["producer_order"] = o.producer_order;
  r["release_each_step"] = o.release_each_step;
  r["rejoin"] = !o.no_rejoin;
  r["timing"] =
      "ferry: PushReport.seconds, from push() called to the commit acknowledged (the sender's "
      "fingerprints of its tensors included); torch: the producer's wall clock from the handoff "
      "started to the consumer's answer after its copies; ceiling: CUDA events around one "
      "cudaMemcpyAsync D2D of the same bytes";
  r["ceiling"] = c.ceiling.json();
  r["ceiling"]["what"] = o.device == "cuda" ? "cudaMemcpyAsync device to device" : "memcpy";
  Json ferry = Json::array();
  for (const auto& f : c.ferry) {
    Json j = f.timing.json();
    j["mode"] = f.mode;
    j["direct"] = f.direct;
    j["transport"] = f.transport;
    j["buckets"] = f.buckets;
    j["verified"] = f.verified;
    j["verification"] = f.verification;
    if (o.release_each_step) {
      j["release"] = f.release.json();
      j["resume"] = f.resume.json();
      j["pushes_through_kept_session"] = f.reused_sessions;
    }
    const double fm = f.timing.median();
    if (fm > 0) {
      j["of_ceiling"] = c.ceiling.median() / fm;
      j["target"] = kTarget;
      j["target_met"] = c.ceiling.median() / fm >= kTarget;
      if (!c.torch_per_tensor.runs_s.empty()) j["vs_torch_per_tensor"] = c.torch_per_tensor.median() / fm;
      if (!c.torch_bucket.runs_s.empty()) j["vs_torch_bucket"] = c.torch_bucket.median() / fm;
    }
    ferry.push_back(j);
  }
  r["ferry"] = ferry;
  if (c.torch.available) {
    r["torch"] = c.torch.data;
  } else {
    r["torch"] = Json{{"unavailable", c.torch.reason}, {"script", c.torch.script}};
  }
  return r;
}

}  // namespace

std::unique_ptr<SenderTensors> make_host_tensors(std::size_t count, std::uint64_t bytes) {
  return std::make_unique<HostTensors>(count, bytes);
}

std::vector<double> measure_copy_ceiling_host(std::uint64_t bytes, int repeat) {
  Watchdog::phase("cuda_ipc: the memcpy ceiling");
  std::vector<std::byte> src(bytes), dst(bytes, std::byte{kPoisonByte});
  fill_pattern_cpu(src.data(), bytes, 77);
  std::memcpy(dst.data(), src.data(), bytes);
  std::vector<double> runs;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (std::memcmp(dst.data(), src.data(), bytes) != 0) {
    fail(FERRY_STATUS_CORRUPT_DATA, "bench cuda_ipc: the memcpy ceiling's copy differs");
  }
  return runs;
}

int run_cuda_ipc_bench(const GlobalOptions& globals, const CudaIpcBenchOptions& options,
                       Json& records) {
  CudaIpcBenchOptions o = options;
  const bool cuda = o.device == "cuda";
  if (cuda && !gpu_present()) {
    std::fprintf(stderr,
                 "ferry bench cuda_ipc: needs a GPU (CUDA IPC moves device memory between two "
                 "processes of one GPU); %s. `--device cpu` runs the bench's CPU check instead.\n",
                 FERRY_HAVE_CUDA ? "this machine has none" : "this ferry was built without CUDA");
    return 2;
  }
  if (o.transport.empty()) o.transport = cuda ? "cuda_ipc" : "inline";
  if (o.modes.empty()) {
    o.modes = cuda ? std::vector<std::string>{"direct", "direct-reread", "staged"}
                   : std::vector<std::string>{"auto"};
  }
  for (const auto& mode : o.modes) (void)delivery_of(mode);  // refuses a typo before anything runs
  if (o.repeat <= 0) o.repeat = cuda ? 5 : 3;
  if (o.total_gib <= 0) o.total_gib = cuda ? 16 : 1.0 / 16;
  // The cuda_ipc plugin's preferred bucket size (its README); elsewhere the config's.
  if (o.bucket_bytes == 0) o.bucket_bytes = cuda ? kDeviceBucketBytes : 0;
  if (o.tensor_counts.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "bench cuda_ipc: no --tensors");
  const auto total_wanted = static_cast<std::uint64_t>(o.total_gib * static_cast<double>(kGiB));

  const config::Config config = load_config(globals);
  if (o.bucket_bytes == 0) o.bucket_bytes = config.update.bucket_bytes;
  // The sender's per-push info lines only with --log-level debug or trace (the bench prints its
  // own progress).
  if (globals.log_level == "info") set_log_level("warn");
  auto registry = make_registry(globals, config);
  // A missing plugin is said now, before anything is allocated or started.
  if (o.transport != "inline") (void)registry->transport(o.transport);

  char dir_template[] = "/tmp/ferry-bench-cuda-ipc-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) fail(FERRY_STATUS_IO, "bench cuda_ipc: mkdtemp failed");
  const fs::path run_dir = dir_template;

  BenchOptions torch_options;
  torch_options.python = o.python;
  torch_options.torch_script = o.torch_script;
  torch_options.baseline_timeout_s = o.baseline_timeout_s;

  std::vector<CountResult> results;
  int code = 0;
  for (const std::uint64_t count : o.tensor_counts) {
    CountResult c;
    c.tensors = count;
    // [rows, 1024] bf16 tensors: a whole number of 2 KiB rows each.
    c.tensor_bytes = total_wanted / count / (2 * kRowElements) * (2 * kRowElements);
    if (c.tensor_bytes == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "bench cuda_ipc: {} GiB over {} tensors leaves less than one 2 KiB row per tensor",
           o.total_gib, count);
    }
    c.total = c.tensor_bytes * count;
    std::printf("bench cuda_ipc: %llu tensors of %s (%s in all), %s\n",
                static_cast<unsigned long long>(count), binary_size(c.tensor_bytes).c_str(),
                decimal_bytes(static_cast<double>(c.total)).c_str(),
                cuda ? "on GPU 0" : "in host memory (CPU check)");
    std::fflush(stdout);
    {
      Watchdog::phase("cuda_ipc: allocating the sender's tensors");
#if FERRY_HAVE_CUDA
      auto tensors = cuda ? make_cuda_tensors(count, c.tensor_bytes, o.sender_memory == "flat")
                          : make_host_tensors(count, c.tensor_bytes);
#else
      auto tensors = make_host_tensors(count, c.tensor_bytes);
#endif
      for (const auto& mode : o.modes) {
        FerryRun run = run_ferry(globals, config, *registry, o, o.transport, mode, *tensors,
                                 c.tensor_bytes, run_dir / fmt::format("{}-{}", count, mode));
        std::printf("  ferry %s over %s: first %s ms, median %s ms, %s\n", mode.c_str(),
                    run.transport.c_str(), ms(run.timing.first_s).c_str(),
                    ms(run.timing.median()).c_str(),
                    run.verified ? "verified" : ("FAILED: " + run.verification).c_str());
        if (o.release_each_step) {
          std::printf("    each step: release %s ms, resume %s ms (medians); %d of %zu timed "
                      "pushes through the session kept from the push before\n",
                      ms(run.release.median()).c_str(), ms(run.resume.median()).c_str(),
                      run.reused_sessions, run.timing.runs_s.size());
        }
        std::fflush(stdout);
        if (!run.verified) code = 1;
        c.ferry.push_back(std::move(run));
      }
    }  // the sender's tensors are freed before torch allocates its own
    // The ceiling is measured after ferry's runs, not before them: right after the previous
    // count's torch baseline processes exit, the GPU is still being given back and a flat copy
    // measured ~11% slow (8.9 ms instead of 8.0 for 17 GB on an H200), which flattered ferry's
    // ratio at the second count.
#if FERRY_HAVE_CUDA
    c.ceiling.runs_s = cuda ? measure_copy_ceiling_cuda(c.total, o.repeat)
                            : measure_copy_ceiling_host(c.total, o.repeat);
#else
    c.ceiling.runs_s = measure_copy_ceiling_host(c.total, o.repeat);
#endif
    if (o.no_torch) {
      c.torch.reason = "skipped (--no-torch)";
    } else {
      c.torch = run_torch_baseline(
          torch_options, {"--case", "cuda_ipc", "--device", o.device, "--count",
                          std::to_string(count), "--bytes", std::to_string(c.tensor_bytes),
                          "--repeat", std::to_string(o.repeat)});
      c.torch_per_tensor = torch_timing(c.torch, "per_tensor");
      c.torch_bucket = torch_timing(c.torch, "bucket");
      if (c.torch.available && !c.torch.data.value("verified", false)) {
        std::printf("  torch baseline: WRONG RESULT: %s\n",
                    c.torch.data.value("verification", std::string("?")).c_str());
        code = 1;
      }
    }
    records.push_back(record_of(o, c, cuda ? Device::cuda : Device::cpu));
    results.push_back(std::move(c));
  }

  std::printf("\nferry bench cuda_ipc: update of %s bf16 per call, sender (this process) -> "
              "ferry serve --device %s (identity layout, created by the first push), transport "
              "'%s', buckets of %s, %d timed calls after the first; sender tensors: %s; GB/s = "
              "payload / time\n",
              decimal_bytes(static_cast<double>(results.front().total)).c_str(),
              cuda ? "cuda:0" : "cpu", o.transport.c_str(), binary_size(o.bucket_bytes).c_str(),
              o.repeat,
              !cuda ? "host memory"
              : o.sender_memory == "flat" ? "carved from one cudaMalloc"
                                          : "one cudaMalloc each");
  print_tables(o, results);
  // With --log-level debug or trace the receivers' logs (their phase timings) are kept too.
  const bool keep_logs = globals.log_level == "debug" || globals.log_level == "trace";
  if (code == 0 && !keep_logs) {
    std::error_code ec;
    fs::remove_all(run_dir, ec);
  } else {
    std::printf("receiver logs kept in %s\n", run_dir.c_str());
  }
  return code;
}

CudaIpcBenchCommand add_cuda_ipc_bench_command(CLI::App* bench, const GlobalOptions& globals) {
  CLI::App* app = bench->add_subcommand(
      "cuda_ipc", "a colocated update through CUDA IPC into a ferry serve child on the same GPU "
                  "vs the D2D ceiling and torch.multiprocessing");
  auto o = std::make_shared<CudaIpcBenchOptions>();
  app->add_option("--device", o->device, "cuda, or cpu for the bench's CPU check (host tensors)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app->add_option("--total-gib", o->total_gib, "GiB per update (default 16; cpu 1/16)")
      ->check(CLI::PositiveNumber);
  app->add_option("--tensors", o->tensor_counts, "tensor counts (default 256 4096)")
      ->check(CLI::PositiveNumber);
  app->add_option("--modes", o->modes,
                  "delivery modes: direct, direct-reread, staged, auto (default on cuda: direct "
                  "direct-reread staged; cpu: auto)");
  app->add_option("--transport", o->transport,
                  "the Sender's transport (default cuda_ipc; cpu: inline, or ucx)");
  app->add_option("--bucket-bytes", o->bucket_bytes,
                  "the Sender's bucket size (default 512 MiB on cuda; cpu: the config's)")
      ->check(CLI::PositiveNumber);
  app->add_option("--group-bytes", o->group_bytes,
                  "direct delivery with fingerprinting copies: bytes of buckets per copy launch "
                  "(default: the Sender's, SenderOptions::fingerprinted_group_bytes)")
      ->check(CLI::PositiveNumber);
  app->add_option("--sender-memory", o->sender_memory,
                  "the sender's CUDA tensors: per-tensor (one cudaMalloc each, the default) or "
                  "flat (carved from one allocation, as FSDP and Megatron keep parameters)")
      ->check(CLI::IsMember({"per-tensor", "flat"}));
  app->add_option("--producer-order", o->producer_order,
                  "how push() waits for the tensors' producer: sync_devices (the default, what a "
                  "caller naming no stream gets) or none (the bench's fill already synchronised: "
                  "ferry's own cost)")
      ->check(CLI::IsMember({"sync_devices", "none"}));
  app->add_flag("--release-each-step", o->release_each_step,
               "the colocated RL loop: before each timed push the receiver releases its weights "
               "and KV cache, the trainer allocates and frees that much device memory, the "
               "receiver resumes");
  app->add_flag("--no-rejoin", o->no_rejoin,
               "with --release-each-step: the Sender does not rejoin the session the release "
               "suspended (each push after a release opens a new session)");
  app->add_option("--repeat", o->repeat, "timed calls after the first (default 5; cpu 3)")
      ->check(CLI::PositiveNumber);
  app->add_option("--json", o->json_path, "write the records (a JSON array) to FILE");
  app->add_option("--timeout", o->timeout_s,
                  "give up (exit 3) after this many seconds, whatever hangs (default 570)")
      ->check(CLI::PositiveNumber);
  app->add_option("--python", o->python, "interpreter for bench/torch_baselines.py");
  app->add_option("--torch-script", o->torch_script, "path of torch_baselines.py");
  app->add_flag("--no-torch", o->no_torch, "skip the torch baselines");
  app->add_option("--baseline-timeout", o->baseline_timeout_s,
                  "kill a torch baseline process after this many seconds (default 300)")
      ->check(CLI::PositiveNumber);
  Action action = [o, &globals]() -> int {
    Watchdog watchdog(o->timeout_s);
    Json records = Json::array();
    int code = 0;
    try {
      code = run_cuda_ipc_bench(globals, *o, records);
    } catch (...) {
      if (!o->json_path.empty() && !records.empty()) write_records(o->json_path, records);
      throw;
    }
    if (!o->json_path.empty() && !records.empty()) {
      write_records(o->json_path, records);
      std::printf("\nrecords written to %s\n", o->json_path.c_str());
    }
    return code;
  };
  return CudaIpcBenchCommand{app, std::move(action)};
}

}  // namespace ferry::bench
