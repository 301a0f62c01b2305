// demo/sync_loop.cpp: the trainer's side of `ferry demo` (see sync_loop.hpp): the synthetic model
// changed every step and delivered to a real receiver (a `ferry serve` child) through the chosen
// transport, memory lent back (release/resume), and each step verified by comparing the
// receiver's fingerprints with the trainer's. Prints a line per step and a final table.
#include "demo/sync_loop.hpp"

#include <ferry/sdk/bucket_packing.hpp>
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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "demo/receiver_process.hpp"
#include "demo/synthetic_model.hpp"
#include "demo/transport.hpp"
#include "session/sender/sender.hpp"
#include "store/store_device.hpp"

namespace ferry::demo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::uint64_t kDemoSeed = 20250101;
constexpr const char* kFingerprintAlgorithm = FERRY_FINGERPRINT_ALGORITHM;

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

// The trainer's weights on the receiver's GPU (a colocated trainer, when the transport moves CUDA memory): one device
// allocation holding every tensor (each at a multiple of FERRY_BUCKET_ALIGNMENT), refreshed
// from the host copy every step.
class TrainerDeviceCopy {
 public:
  TrainerDeviceCopy(const SyntheticModel& model, int device) : device_(device) {
#if FERRY_HAVE_CUDA
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < model.tensors().size(); ++i) {
      offsets_.push_back(total);
      total += sdk::bucket_align_up(model.published(i).size());
    }
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMalloc(&base_, std::max<std::uint64_t>(total, FERRY_BUCKET_ALIGNMENT)),
          "cudaMalloc");
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
  void refresh(const SyntheticModel& model) {
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

// $XDG_CACHE_HOME/ferry/demo-<key>, else ~/.cache/ferry/demo-<key>.
fs::path default_work_dir(const ModelShape& shape) {
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
fs::path prepare_initial_checkpoint(const SyntheticModel& model, const fs::path& work_dir,
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
json expect_ok(ReceiverProcess& receiver, const Answer& answer,
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
std::string verify(ReceiverProcess& receiver, const SyntheticModel& model,
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

// One step pushed from the trainer's published (BF16) weights, read in place; returns the bytes.
std::uint64_t push_step(session::Sender& sender, SyntheticModel& model, std::uint32_t step,
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

// The trainer's loop against one receiver process: start it, verify the initial weights, then
// for every step change the weights, deliver them, lend memory, and verify. Throws ferry::Error
// at the first failure; `rows` holds every step attempted so far (the failed one included).
struct SyncLoop {
  const std::filesystem::path& ferry_exe;
  const std::vector<std::string>& serve_globals;
  const config::Config& config;
  const registry::Registry& registry;
  DemoTransport transport;  // "disk", or a push through a plugin or inline
  SyntheticModel& model;
  fs::path work_dir;
  std::uint32_t steps = 0;
  bool keep = false;
  std::vector<StepRow> rows;
  fs::path current_step_dir;  // kept on failure, for inspection

  void run(const fs::path& initial) {
    ReceiverOptions ro;
    ro.exe = ferry_exe;
    ro.global_args = serve_globals;
    ro.serve_args = {"--model-path", initial.string(), "--model-family", "dense", "--layout",
                     "engine",       "--device",       config.demo.device, "--tp-rank", "0",
                     "--tp-size",    "1"};
    ro.run_dir = work_dir;
    // Generous for slow disks: a minute plus 50 MB/s for the initial load and every update.
    ro.ready_deadline_s = 60 + static_cast<double>(model.bytes()) / 50e6;
    ro.request_deadline_s = ro.ready_deadline_s;
    ro.token = config.receiver.token;
    const auto start = std::chrono::steady_clock::now();
    ReceiverProcess receiver(ro);
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
    if (transport.device_tensors) {
      gpu = std::make_unique<TrainerDeviceCopy>(model,
                                                store::parse_store_device(config.demo.device).ordinal);
    }
    if (transport.name != "disk") {
      session::SenderOptions so;
      so.receivers = {fmt::format("127.0.0.1:{}", receiver.port())};
      so.transport = transport.name;
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

// The receiver's device: cpu, cuda or cuda:N; refused here (before any checkpoint is written)
// when this build or machine cannot use it.
void check_device(const std::string& device) {
  try {
    store::check_store_device(store::parse_store_device(device));
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("ferry demo: {}", e.what()));
  }
}

int run(const DemoRun& request) {
  const config::Config& config = request.config;
  const config::DemoConfig& dc = config.demo;
  const DemoTransport transport = choose_transport(config, request.registry);
  const auto shape = ModelShape::from_sizes(dc.hidden_size, dc.layers, dc.vocab_size);
  const fs::path work_dir =
      request.work_dir ? fs::absolute(*request.work_dir) : default_work_dir(shape);
  fs::create_directories(work_dir);

  SyntheticModel model(shape, kDemoSeed);
  fmt::print(
      "ferry demo: Qwen3-shaped model (hidden {}, {} layers, vocab {}, {} heads / {} kv heads, "
      "intermediate {}): {} tensors, {} per update\n"
      "ferry demo: {} step{} over transport '{}' on {}, work folder {}\n",
      shape.hidden, shape.layers, shape.vocab, shape.heads, shape.kv_heads, shape.intermediate,
      model.tensors().size(), mib(model.bytes()), dc.steps, dc.steps == 1 ? "" : "s", transport.name, dc.device,
      work_dir.string());
  const fs::path initial =
      prepare_initial_checkpoint(model, work_dir, fmt::format("ferry-demo-v1 {} seed {}",
                                                              shape.key(), kDemoSeed));
  std::fflush(stdout);

  SyncLoop loop{request.ferry_exe, request.serve_globals, config, request.registry, transport,
                model, work_dir, dc.steps, request.keep, {}, {}};
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
}

}  // namespace ferry::demo
