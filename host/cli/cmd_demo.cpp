// cli/cmd_demo.cpp: `ferry demo`: a complete RL weight-sync loop on a synthetic Qwen3-shaped
// model. The trainer (this process) changes its weights every step and delivers them to a real
// receiver (a `ferry serve` child) through the best transport available, lends it memory back
// (release/resume), and verifies each step by comparing the receiver's fingerprints with its own.
// Prints a line per step and a final table; exits 1 on any failure or mismatch.
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/context.hpp"
#include "cli/demo_model.hpp"
#include "cli/demo_receiver.hpp"
#include "common/log.hpp"
#include "registry/registry.hpp"
#include "session/sender.hpp"
#include "store/store_device.hpp"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::uint64_t kDemoSeed = 20250101;
constexpr const char* kFingerprintAlgorithm = "xxh64-chunked-v1";

struct DemoOptions {
  std::optional<std::uint32_t> steps;
  std::optional<std::uint64_t> hidden_size, vocab_size;
  std::optional<std::uint32_t> layers;
  std::optional<std::string> transport, device, work_dir;
  bool keep = false;
};

struct StepRow {
  std::uint32_t step = 0;
  std::string version;
  std::uint64_t bytes = 0;
  double seconds = 0;         // the update request, as the trainer waits for it
  double release_resume = 0;  // both requests
  bool verified = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

double gb_per_s(std::uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0;
}

// "auto" picks the best transport this build can drive from the demo: with the receiver on a GPU,
// CUDA IPC (the trainer's weights on the same GPU, a colocated push) when its plugin loads; else
// UCX (a push through the session protocol) when its plugin loads; else disk (checkpoints the
// receiver reads). "inline" pushes with the bytes on the session socket itself.
std::string choose_transport(const std::string& requested, const std::string& device,
                             const registry::Registry& registry) {
  if (requested == "disk" || requested == "inline") return requested;
  const bool on_gpu = store::parse_store_device(device).cuda;
  auto loadable = [&](const char* name, std::string& why) {
    try {
      (void)registry.transport(name);
      return true;
    } catch (const Error& e) {
      why = e.what();
      return false;
    }
  };
  if (requested == "cuda_ipc") {
    if (!on_gpu) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ferry demo: transport 'cuda_ipc' needs the receiver on a GPU (--device cuda or "
           "cuda:N), not '{}'",
           device);
    }
    std::string why;
    if (!loadable("cuda_ipc", why)) {
      fail(FERRY_STATUS_NOT_FOUND, "ferry demo: transport 'cuda_ipc' is not available: {}", why);
    }
    return "cuda_ipc";
  }
  if (requested == "auto" || requested == "ucx") {
    std::string why;
    if (requested == "auto" && on_gpu) {
      if (loadable("cuda_ipc", why)) return "cuda_ipc";
      logger("demo")->info("CUDA IPC transport not available ({})", why);
    }
    if (loadable("ucx", why)) return "ucx";
    if (requested == "ucx") {
      fail(FERRY_STATUS_NOT_FOUND, "ferry demo: transport 'ucx' is not available: {}", why);
    }
    logger("demo")->info("UCX transport not available ({}); using disk", why);
    return "disk";
  }
  for (const char* later : {"nccl", "ckpt_engine"}) {
    if (requested == later) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "ferry demo cannot drive transport '{}' yet (available: cuda_ipc, ucx, inline, disk; "
           "'auto' picks the best)",
           requested);
    }
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "unknown transport '{}' (use auto, cuda_ipc, ucx, inline or disk)", requested);
}

// The trainer's weights on the receiver's GPU (cuda_ipc: a colocated trainer): one device
// allocation holding every tensor (256-byte aligned), refreshed from the host copy every step.
class TrainerDeviceCopy {
 public:
  TrainerDeviceCopy(const demo::SyntheticModel& model, int device) : device_(device) {
#if FERRY_HAVE_CUDA
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < model.tensors().size(); ++i) {
      offsets_.push_back(total);
      total += (model.published(i).size() + 255) / 256 * 256;
    }
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMalloc(&base_, std::max<std::uint64_t>(total, 256)), "cudaMalloc");
#else
    (void)model;
    fail(FERRY_STATUS_UNIMPLEMENTED, "ferry demo: the trainer's GPU copy needs a build with CUDA");
#endif
  }
  ~TrainerDeviceCopy() {
#if FERRY_HAVE_CUDA
    if (base_ != nullptr) (void)cudaFree(base_);
#endif
  }
  TrainerDeviceCopy(const TrainerDeviceCopy&) = delete;
  TrainerDeviceCopy& operator=(const TrainerDeviceCopy&) = delete;

  // Copies the model's current weights to the GPU (complete when it returns).
  void refresh(const demo::SyntheticModel& model) {
#if FERRY_HAVE_CUDA
    check(cudaSetDevice(device_), "cudaSetDevice");
    for (std::size_t i = 0; i < offsets_.size(); ++i) {
      const auto& bytes = model.published(i);
      check(cudaMemcpy(data(i), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
            "cudaMemcpy to the trainer's GPU copy");
    }
#else
    (void)model;
#endif
  }
  void* data(std::size_t i) const { return static_cast<std::byte*>(base_) + offsets_.at(i); }
  int device() const { return device_; }

 private:
#if FERRY_HAVE_CUDA
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      fail(FERRY_STATUS_IO, "ferry demo: trainer's GPU copy: {}: {}", what, cudaGetErrorString(e));
    }
  }
#endif
  int device_ = 0;
  void* base_ = nullptr;
  std::vector<std::uint64_t> offsets_;
};

// The receiver's device: cpu, cuda or cuda:N; refused here (before any checkpoint is written)
// when this build or machine cannot use it.
void check_device(const std::string& device) {
  try {
    store::check_store_device(store::parse_store_device(device));
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("ferry demo: {}", e.what()));
  }
}

// $XDG_CACHE_HOME/ferry/demo-<key>, else ~/.cache/ferry/demo-<key>.
fs::path default_work_dir(const demo::ModelShape& shape) {
  fs::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    base = fs::path(home) / ".cache";
  } else {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ferry demo: neither XDG_CACHE_HOME nor HOME is set; pass --work-dir DIR");
  }
  return base / "ferry" / ("demo-" + shape.key());
}

// The initial checkpoint, generated once per shape and reused while it still holds exactly the
// generated weights (anything else, say a truncated or edited shard, is rewritten).
fs::path prepare_initial_checkpoint(const demo::SyntheticModel& model, const fs::path& work_dir,
                                    const std::string& tag) {
  const fs::path dir = work_dir / "initial";
  std::string why;
  if (fs::exists(dir)) {
    if (model.checkpoint_matches(dir, tag, why)) {
      fmt::print("trainer: reusing the cached initial checkpoint {}\n", dir.string());
      return dir;
    }
    fmt::print("trainer: the cached initial checkpoint {} is not usable ({}); regenerating it\n",
               dir.string(), why);
  }
  const auto start = std::chrono::steady_clock::now();
  // Written aside and renamed, so a demo killed half-way never leaves a partial cache behind.
  const fs::path partial = work_dir / fmt::format("initial.partial-{}", ::getpid());
  fs::remove_all(partial);
  model.write_checkpoint(partial, tag);
  fs::remove_all(dir);
  std::error_code ec;
  fs::rename(partial, dir, ec);
  if (ec) {
    fs::remove_all(partial);
    if (!model.checkpoint_matches(dir, tag, why)) {
      fail(FERRY_STATUS_IO, "cannot store the initial checkpoint in {}: {}", dir.string(),
           ec.message());
    }
  }
  fmt::print("trainer: wrote the initial checkpoint {} in {:.2f} s\n", dir.string(),
             seconds_since(start));
  return dir;
}

// Fails with the receiver's reason (and its log when it stopped answering) unless `answer` is
// a 200.
json expect_ok(demo::ReceiverProcess& receiver, const demo::Answer& answer,
               const std::string& what) {
  if (answer.status == 200) return answer.body;
  if (answer.status == 0) {
    const std::string state = receiver.running()
                                  ? std::string("it is still running")
                                  : "it " + receiver.how_it_ended();
    fail(FERRY_STATUS_PEER_FAILED, "{}: no answer from the receiver ({}; {}); its log ends with:\n{}",
         what, answer.text, state, receiver.log_tail());
  }
  std::string message = answer.text;
  if (answer.body.is_object() && answer.body.contains("message") &&
      answer.body["message"].is_string()) {
    message = answer.body["message"].get<std::string>();
  }
  fail(FERRY_STATUS_PEER_FAILED, "{}: the receiver answered HTTP {}: {}", what, answer.status,
       message);
}

// "" when the receiver's fingerprints are exactly the trainer's (same names, same values);
// otherwise what differs.
std::string compare_fingerprints(const std::map<std::string, std::uint64_t>& expected,
                                 const json& answer) {
  if (!answer.is_object() || !answer.contains("fingerprints") ||
      !answer["fingerprints"].is_object()) {
    return "GET /get_fingerprints gave no 'fingerprints' object";
  }
  if (answer.value("algorithm", "") != kFingerprintAlgorithm) {
    return fmt::format("the receiver fingerprints with '{}', expected '{}'",
                       answer.value("algorithm", ""), kFingerprintAlgorithm);
  }
  const json& reported = answer["fingerprints"];
  std::vector<std::string> differ, missing, extra;
  for (const auto& [name, value] : expected) {
    auto it = reported.find(name);
    if (it == reported.end()) {
      missing.push_back(name);
      continue;
    }
    const std::string want = fmt::format("{:016x}", value);
    const std::string got = it->is_string() ? it->get<std::string>() : it->dump();
    if (got != want) differ.push_back(fmt::format("{} (receiver {}, trainer {})", name, got, want));
  }
  for (const auto& [name, value] : reported.items()) {
    if (expected.find(name) == expected.end()) extra.push_back(name);
  }
  if (differ.empty() && missing.empty() && extra.empty()) return "";
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 3) out += fmt::format(", and {} more", names.size() - 3);
    return out;
  };
  std::string why = "fingerprint mismatch:";
  if (!differ.empty()) {
    why += fmt::format(" {} of {} parameters differ: {};", differ.size(), expected.size(),
                       list(differ));
  }
  if (!missing.empty()) why += fmt::format(" missing on the receiver: {};", list(missing));
  if (!extra.empty()) why += fmt::format(" unexpected on the receiver: {};", list(extra));
  why.pop_back();
  return why;
}

// The receiver is healthy, publishes `version` and holds exactly the trainer's weights.
// Returns "" or the reason it does not.
std::string verify(demo::ReceiverProcess& receiver, const demo::SyntheticModel& model,
                   const std::string& version) {
  const auto health = receiver.get("/health");
  if (health.status != 200) {
    return fmt::format("GET /health answered {}: {}", health.status, health.text);
  }
  if (!version.empty()) {
    const json v = expect_ok(receiver, receiver.get("/get_weight_version"), "GET /get_weight_version");
    if (v.value("weight_version", "") != version) {
      return fmt::format("the receiver publishes weight version '{}', expected '{}'",
                         v.value("weight_version", ""), version);
    }
  }
  const json prints = expect_ok(receiver, receiver.get("/get_fingerprints"), "GET /get_fingerprints");
  return compare_fingerprints(model.engine_fingerprints(), prints);
}

void print_table(const std::vector<StepRow>& rows) {
  if (rows.empty()) return;
  fmt::print("\n{:>5}  {:<10}  {:>10}  {:>8}  {:>6}  {}\n", "step", "version", "bytes", "seconds",
             "GB/s", "verified");
  for (const StepRow& r : rows) {
    fmt::print("{:>5}  {:<10}  {:>10}  {:>8.3f}  {:>6.2f}  {}\n", r.step, r.version, mib(r.bytes),
               r.seconds, gb_per_s(r.bytes, r.seconds), r.verified ? "yes" : "NO");
  }
}

// The arguments placed before "serve" so the receiver sees the same config and plugins.
std::vector<std::string> forwarded_globals(const GlobalOptions& globals) {
  std::vector<std::string> out;
  if (!globals.config_path.empty()) out.insert(out.end(), {"--config", globals.config_path});
  for (const auto& s : globals.overrides) out.insert(out.end(), {"--set", s});
  for (const auto& d : globals.plugin_dirs) out.insert(out.end(), {"--plugin-dir", d});
  const bool verbose = globals.log_level == "debug" || globals.log_level == "trace";
  out.insert(out.end(), {"--log-level", verbose ? globals.log_level : std::string("warn")});
  return out;
}

// The trainer's loop against one receiver process: start it, verify the initial weights, then
// for every step change the weights, deliver them, lend memory, and verify. Throws ferry::Error
// at the first failure; `rows` holds every step attempted so far (the failed one included).
// One step pushed from the trainer's published (BF16) weights, read in place; returns the bytes.
std::uint64_t push_step(session::Sender& sender, demo::SyntheticModel& model, std::uint32_t step,
                        const std::string& version, TrainerDeviceCopy* gpu) {
  if (gpu != nullptr) gpu->refresh(model);
  std::vector<session::TensorView> views;
  views.reserve(model.tensors().size());
  for (std::size_t i = 0; i < model.tensors().size(); ++i) {
    const auto& spec = model.tensors()[i];
    session::TensorView v;
    v.name = spec.name;
    v.dtype = FERRY_DTYPE_BF16;
    v.shape = spec.shape;
    v.data = model.published(i).data();
    if (gpu != nullptr) {
      v.data = gpu->data(i);
      v.memory_kind = FERRY_MEMORY_CUDA;
      v.device = gpu->device();
    }
    views.push_back(std::move(v));
  }
  // The initial load is version 1 and versions only increase: step s is version s + 1, as a
  // disk update of it would be.
  const session::PushReport report = sender.push(views, step + 1, version);
  for (const auto& r : report.receivers) {
    if (!r.committed) {
      fail(FERRY_STATUS_PEER_FAILED, "push of {} over {} to {} failed: {}", version,
           r.transport.empty() ? std::string("?") : r.transport, r.address, r.error);
    }
  }
  return report.bytes;
}

struct SyncLoop {
  const GlobalOptions& globals;
  const config::Config& config;
  const registry::Registry& registry;
  std::string transport;  // "disk", or a push: "cuda_ipc" / "ucx" / "inline"
  demo::SyntheticModel& model;
  fs::path work_dir;
  std::uint32_t steps = 0;
  bool keep = false;
  std::vector<StepRow> rows;
  fs::path current_step_dir;  // kept on failure, for inspection

  void run(const fs::path& initial) {
    demo::ReceiverOptions ro;
    ro.exe = fs::read_symlink("/proc/self/exe");
    ro.global_args = forwarded_globals(globals);
    ro.serve_args = {"--model-path", initial.string(), "--model-family", "dense", "--layout",
                     "engine",       "--device",       config.demo.device, "--tp-rank", "0",
                     "--tp-size",    "1"};
    ro.run_dir = work_dir;
    // Generous for slow disks: a minute plus 50 MB/s for the initial load and every update.
    ro.ready_deadline_s = 60 + static_cast<double>(model.bytes()) / 50e6;
    ro.request_deadline_s = ro.ready_deadline_s;
    ro.token = config.receiver.token;
    const auto start = std::chrono::steady_clock::now();
    demo::ReceiverProcess receiver(ro);
    fmt::print("receiver: ferry serve (pid {}) listening on 127.0.0.1:{}, ready in {:.2f} s (log {})\n",
               receiver.pid(), receiver.port(), seconds_since(start),
               (work_dir / "serve.log").string());
    if (std::string why = verify(receiver, model, ""); !why.empty()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "the receiver's initial weights are not the trainer's: {}",
           why);
    }
    fmt::print("receiver: initial weights verified ({} parameters)\n\n",
               model.engine_fingerprints().size());
    std::fflush(stdout);

    // With the backup policy the receiver keeps its weights across release/resume, so the
    // check after resume also proves the restore. With discard, resume gives zeroed memory
    // until the next update, so a colocated trainer borrows the memory before the update.
    const bool backup = config.memory.weights_policy == config::ReleasePolicy::backup;
    std::unique_ptr<session::Sender> sender;
    std::unique_ptr<TrainerDeviceCopy> gpu;
    if (transport == "cuda_ipc") {
      gpu = std::make_unique<TrainerDeviceCopy>(model,
                                                store::parse_store_device(config.demo.device).ordinal);
    }
    if (transport != "disk") {
      session::SenderOptions so;
      so.receivers = {fmt::format("127.0.0.1:{}", receiver.port())};
      so.transport = transport;
      so.bucket_bytes = config.update.bucket_bytes;
      so.token = config.receiver.token;
      sender = std::make_unique<session::Sender>(config, registry, so);
    }
    fs::path previous_dir;
    for (std::uint32_t s = 1; s <= steps; ++s) {
      StepRow row;
      row.step = s;
      row.version = fmt::format("step-{}", s);
      model.apply_step(s);
      if (!sender) {
        current_step_dir = work_dir / row.version;
        fs::remove_all(current_step_dir);
        model.write_checkpoint(current_step_dir, "ferry-demo-v1 " + row.version);
      }

      auto release_resume = [&] {
        const auto t = std::chrono::steady_clock::now();
        expect_ok(receiver, receiver.post("/release_memory_occupation", json::object()),
                  "POST /release_memory_occupation");
        expect_ok(receiver, receiver.post("/resume_memory_occupation", json::object()),
                  "POST /resume_memory_occupation");
        row.release_resume = seconds_since(t);
      };
      if (!backup) release_resume();
      const auto t = std::chrono::steady_clock::now();
      if (sender) {
        row.bytes = push_step(*sender, model, s, row.version, gpu.get());
      } else {
        const json report = expect_ok(
            receiver,
            receiver.post("/update_weights_from_disk",
                          json{{"model_path", current_step_dir.string()},
                               {"weight_version", row.version}}),
            "POST /update_weights_from_disk (" + row.version + ")");
        row.bytes = report.value("bytes", std::uint64_t{0});
      }
      row.seconds = seconds_since(t);
      if (backup) release_resume();

      const std::string why = verify(receiver, model, row.version);
      row.verified = why.empty();
      rows.push_back(row);
      fmt::print("step {}/{}: version {}, {} in {:.2f} s ({:.2f} GB/s), release+resume {:.2f} s, {}\n",
                 s, steps, row.version, mib(row.bytes), row.seconds,
                 gb_per_s(row.bytes, row.seconds), row.release_resume,
                 row.verified ? "verified" : "NOT verified");
      std::fflush(stdout);
      if (!row.verified) fail(FERRY_STATUS_CORRUPT_DATA, "step {}: {}", s, why);
      if (!previous_dir.empty() && !keep) fs::remove_all(previous_dir);
      previous_dir = current_step_dir;
    }
    if (!keep && !previous_dir.empty()) fs::remove_all(previous_dir);
    current_step_dir.clear();
    sender.reset();
    gpu.reset();
    const std::string ended = receiver.stop();
    if (ended != "exited with status 0") {
      logger("demo")->warn("the receiver {} after SIGTERM", ended);
    }
  }
};

}  // namespace

Action add_demo_command(CLI::App& app, const GlobalOptions& globals) {
  auto* cmd = app.add_subcommand(
      "demo", "run a complete RL weight-sync loop on a synthetic Qwen3-shaped model, verified");
  auto opts = std::make_shared<DemoOptions>();
  cmd->add_option("--steps", opts->steps, "training steps (default: [demo] steps, 5)");
  cmd->add_option("--hidden-size", opts->hidden_size, "model hidden size (default: [demo] hidden_size)");
  cmd->add_option("--layers", opts->layers, "transformer layers (default: [demo] layers)");
  cmd->add_option("--vocab-size", opts->vocab_size, "vocabulary size (default: [demo] vocab_size)");
  cmd->add_option("--transport", opts->transport,
                  fmt::format("{} (default: [demo] transport; auto: cuda_ipc with a GPU receiver, "
                              "else ucx, when available, else disk)",
                              fmt::join(config::demo_transport_names(), ", ")));
  cmd->add_option("--device", opts->device, "receiver weights on cpu, cuda or cuda:N");
  cmd->add_option("--work-dir", opts->work_dir,
                  "cache and scratch folder (default: $XDG_CACHE_HOME or ~/.cache, /ferry/demo-<shape>)");
  cmd->add_flag("--keep", opts->keep, "keep every step's checkpoint in the work folder");
  return [opts, &globals] {
    GlobalOptions g = globals;
    auto set = [&](const char* key, const std::string& value) {
      g.overrides.push_back(std::string(key) + "=" + value);
    };
    if (opts->steps) set("demo.steps", std::to_string(*opts->steps));
    if (opts->hidden_size) set("demo.hidden_size", std::to_string(*opts->hidden_size));
    if (opts->layers) set("demo.layers", std::to_string(*opts->layers));
    if (opts->vocab_size) set("demo.vocab_size", std::to_string(*opts->vocab_size));
    if (opts->transport) set("demo.transport", *opts->transport);
    if (opts->device) set("demo.device", *opts->device);
    const config::Config config = load_config(g);
    const config::DemoConfig& dc = config.demo;
    check_device(dc.device);
    // The demo prints its own progress; the sender's and plugins' per-session info lines (which
    // transport and primitive, printed on every push) only with --log-level debug or trace.
    const bool verbose = globals.log_level == "debug" || globals.log_level == "trace";
    if (!verbose) set_log_level("warn");
    auto registry = make_registry(g, config);
    const std::string transport = choose_transport(dc.transport, dc.device, *registry);
    const auto shape = demo::ModelShape::from_sizes(dc.hidden_size, dc.layers, dc.vocab_size);
    const fs::path work_dir = opts->work_dir ? fs::absolute(*opts->work_dir) : default_work_dir(shape);
    fs::create_directories(work_dir);

    demo::SyntheticModel model(shape, kDemoSeed);
    fmt::print(
        "ferry demo: Qwen3-shaped model (hidden {}, {} layers, vocab {}, {} heads / {} kv heads, "
        "intermediate {}): {} tensors, {} per update\n"
        "ferry demo: {} step{} over transport '{}' on {}, work folder {}\n",
        shape.hidden, shape.layers, shape.vocab, shape.heads, shape.kv_heads, shape.intermediate,
        model.tensors().size(), mib(model.bytes()), dc.steps, dc.steps == 1 ? "" : "s", transport, dc.device,
        work_dir.string());
    const fs::path initial =
        prepare_initial_checkpoint(model, work_dir, fmt::format("ferry-demo-v1 {} seed {}",
                                                                shape.key(), kDemoSeed));
    std::fflush(stdout);

    SyncLoop loop{globals, config, *registry, transport, model, work_dir, dc.steps, opts->keep, {}, {}};
    const auto start = std::chrono::steady_clock::now();
    std::string failure;
    try {
      loop.run(initial);
    } catch (const Error& e) {
      failure = fmt::format("{} ({})", e.what(), status_name(e.code()));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::fflush(stdout);
    print_table(loop.rows);
    if (!failure.empty()) {
      std::fflush(stdout);
      std::fprintf(stderr, "\nferry demo: FAILED: %s\n", failure.c_str());
      if (!loop.current_step_dir.empty() && fs::exists(loop.current_step_dir)) {
        std::fprintf(stderr, "ferry demo: the checkpoint of the failed step is kept in %s\n",
                     loop.current_step_dir.string().c_str());
      }
      return 1;
    }
    fmt::print("\nferry demo: {} verified in {:.2f} s\n",
               dc.steps == 1 ? std::string("the step") : fmt::format("all {} steps", dc.steps),
               seconds_since(start));
    return 0;
  };
}

}  // namespace ferry::cli
