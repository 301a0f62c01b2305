// cli/cmd_push.cpp: `ferry push`: the trainer side from the command line: pushes a safetensors
// checkpoint (or synthetic Qwen3-shaped weights) as one versioned update to one or many receivers
// through the session protocol, and prints per-receiver results and throughput; progress on
// standard error while it runs.
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <sys/mman.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/command.hpp"
#include "cli/context.hpp"
#include "cli/token_option.hpp"
#include "common/log.hpp"
#include "demo/synthetic_model.hpp"
#include <ferry/formats/safetensors.hpp>
#include "session/sender/push_progress.hpp"
#include "session/sender/sender.hpp"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;

struct PushOptions {
  std::string to;
  std::string transport;  // empty: the config's update.transport
  std::optional<std::string> model_path;
  bool synthetic = false;
  std::uint64_t hidden = 512;
  std::uint32_t layers = 8;
  std::uint64_t vocab = 8192;
  std::uint64_t seed = 1;
  std::uint64_t version = 0;
  std::optional<std::string> label;
  std::uint64_t bucket_mb = 256;
  std::optional<std::uint64_t> bucket_bytes;
  std::uint64_t connect_timeout_ms = 10000;
  std::uint64_t bucket_timeout_ms = 60000;
  std::uint64_t commit_timeout_ms = 60000;
  std::optional<std::string> progress;  // a ProgressMode name; default: the config's `progress`
  bool no_progress = false;
  // Test hooks (hidden options, test_hook()).
  std::optional<std::uint32_t> test_exit_after_bucket;
  std::optional<std::uint32_t> test_stall_after_bucket;
  std::optional<std::uint64_t> test_bucket_delay_ms;
};

// A read-only mapping of a whole file (the tensors are viewed in place).
class MappedFile {
 public:
  MappedFile(int fd, std::uint64_t size, const std::string& path) : size_(size) {
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) fail(FERRY_STATUS_IO, "cannot map '{}'", path);
    data_ = static_cast<const std::uint8_t*>(p);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::uint8_t* data() const { return data_; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

std::vector<std::string> split_receivers(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  if (out.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "--to names no receiver");
  return out;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The test hooks of the fault and progress tests (tests/session/), set by hidden options: die
// or stall right after bucket k was handed to the receivers, as a crashed or hung trainer
// would. Dying waits (up to 10 s) until every receiver's session reached bucket k, so that each
// one has begun the update when the sender dies. --test-bucket-delay-ms makes every bucket take
// that much longer, as a slow link would. Empty when none is set.
std::function<void(const std::string&, std::uint32_t)> test_hook(const PushOptions& o,
                                                                 std::size_t receivers) {
  if (o.test_bucket_delay_ms) {
    const auto delay = std::chrono::milliseconds(*o.test_bucket_delay_ms);
    return [delay](const std::string&, std::uint32_t) { std::this_thread::sleep_for(delay); };
  }
  if (!o.test_exit_after_bucket && !o.test_stall_after_bucket) return {};
  const auto exit_k = o.test_exit_after_bucket;
  const auto stall_k = o.test_stall_after_bucket;
  auto arrived = std::make_shared<std::atomic<std::size_t>>(0);
  return [exit_k, stall_k, arrived, receivers](const std::string&, std::uint32_t bucket) {
    if (exit_k && bucket == *exit_k) {
      arrived->fetch_add(1);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived->load() < receivers && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::raise(SIGKILL);
    }
    if (stall_k && bucket == *stall_k) {
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  };
}

}  // namespace

Action add_push_command(CLI::App& app, const GlobalOptions& globals) {
  auto* cmd = app.add_subcommand(
      "push", "push a checkpoint (or synthetic weights) to receivers as one versioned update");
  auto o = std::make_shared<PushOptions>();
  cmd->add_option("--to", o->to, "receivers: HOST:PORT[,HOST:PORT...] of their control API")
      ->required();
  cmd->add_option("--transport", o->transport,
                  "auto, inline or a transport plugin's name (default: the config's "
                  "update.transport, auto)");
  auto* model = cmd->add_option("--model-path", o->model_path,
                                "safetensors file or folder (config.json beside it is sent too)");
  auto* synthetic = cmd->add_flag("--synthetic", o->synthetic,
                                  "push synthetic Qwen3-shaped BF16 weights (see --hidden ...)");
  model->excludes(synthetic);
  cmd->add_option("--hidden", o->hidden, "synthetic: hidden size (default 512)");
  cmd->add_option("--layers", o->layers, "synthetic: layers (default 8)");
  cmd->add_option("--vocab", o->vocab, "synthetic: vocabulary size (default 8192)");
  cmd->add_option("--seed", o->seed, "synthetic: seed (default 1)");
  cmd->add_option("--version", o->version, "the update's version number")->required();
  cmd->add_option("--label", o->label, "weight_version label (default: the number)");
  cmd->add_option("--bucket-mb", o->bucket_mb, "bucket size in MiB (default 256)");
  cmd->add_option("--bucket-bytes", o->bucket_bytes, "bucket size in bytes (overrides --bucket-mb)");
  auto token = add_token_options(*cmd, "bearer token of the receivers' control APIs");
  cmd->add_option("--connect-timeout-ms", o->connect_timeout_ms, "discovery and handshake deadline");
  cmd->add_option("--bucket-timeout-ms", o->bucket_timeout_ms, "per-bucket deadline");
  cmd->add_option("--commit-timeout-ms", o->commit_timeout_ms, "commit deadline");
  auto* progress = cmd->add_option(
      "--progress", o->progress,
      "progress on stderr: auto (in place on a terminal, else a line every progress_interval_ms), "
      "terminal, lines or never (default: the config's progress, auto)");
  cmd->add_flag("--no-progress", o->no_progress, "no progress (--progress never)")
      ->excludes(progress);
  // Test hooks, hidden from --help (test_hook()).
  cmd->add_option("--test-exit-after-bucket", o->test_exit_after_bucket)->group("");
  cmd->add_option("--test-stall-after-bucket", o->test_stall_after_bucket)->group("");
  cmd->add_option("--test-bucket-delay-ms", o->test_bucket_delay_ms)->group("");
  return [o, token, &globals] {
    if (!o->model_path && !o->synthetic) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "give --model-path DIR or --synthetic");
    }
    const config::Config config = load_config(globals);
    auto registry = make_registry(globals, config);

    session::SenderOptions options;
    options.receivers = split_receivers(o->to);
    options.transport = o->transport;
    options.bucket_bytes = o->bucket_bytes.value_or(o->bucket_mb << 20);
    if (options.bucket_bytes == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "bucket size must be > 0");
    options.token = resolve_token(*token).value_or(config.receiver.token);
    options.connect_timeout = std::chrono::milliseconds(o->connect_timeout_ms);
    options.bucket_timeout = std::chrono::milliseconds(o->bucket_timeout_ms);
    options.commit_timeout = std::chrono::milliseconds(o->commit_timeout_ms);
    options.after_bucket = test_hook(*o, options.receivers.size());
    ProgressMode progress_mode = config.progress;
    if (o->no_progress) progress_mode = ProgressMode::never;
    if (o->progress) {
      const auto mode = parse_progress_mode(*o->progress);
      if (!mode) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "--progress '{}': must be one of auto, terminal, lines, never", *o->progress);
      }
      progress_mode = *mode;
    }
    options.progress = session::progress_display(
        progress_mode, std::chrono::milliseconds(config.progress_interval_ms));

    std::vector<session::TensorView> tensors;
    safetensors::Checkpoint checkpoint;
    std::vector<std::unique_ptr<MappedFile>> maps;
    std::unique_ptr<demo::SyntheticModel> synthetic_model;
    if (o->model_path) {
      checkpoint = safetensors::read_checkpoint(*o->model_path, /*keep_open=*/true);
      for (const auto& file : checkpoint.files) {
        maps.push_back(std::make_unique<MappedFile>(file.fd.get(), file.file_size, file.path));
        const std::uint8_t* base = maps.back()->data() + file.data_offset();
        for (const auto& t : file.tensors) {
          tensors.push_back({t.name, t.dtype, t.shape, base + t.begin, FERRY_MEMORY_HOST, 0});
        }
      }
      const fs::path p(*o->model_path);
      options.config_json = read_text((fs::is_directory(p) ? p : p.parent_path()) / "config.json");
    } else {
      synthetic_model = std::make_unique<demo::SyntheticModel>(
          demo::ModelShape::from_sizes(o->hidden, o->layers, o->vocab), o->seed);
      synthetic_model->apply_step(static_cast<std::uint32_t>(o->version));
      const auto& specs = synthetic_model->tensors();
      for (std::size_t i = 0; i < specs.size(); ++i) {
        tensors.push_back({specs[i].name, FERRY_DTYPE_BF16, specs[i].shape,
                           synthetic_model->published(i).data(), FERRY_MEMORY_HOST, 0});
      }
      options.config_json = synthetic_model->config_json();
    }

    session::Sender sender(config, *registry, options);
    const auto report = sender.push(tensors, o->version, o->label);
    std::size_t committed = 0;
    for (const auto& r : report.receivers) {
      if (r.committed) {
        ++committed;
        std::cout << fmt::format(
                         "receiver {}: committed version {} via {}: {} buckets, {:.1f} MiB in "
                         "{:.3f} s ({:.1f} MB/s)",
                         r.address, report.version, r.transport, r.buckets, r.bytes / 1048576.0,
                         r.seconds, r.seconds > 0 ? r.bytes / r.seconds / 1e6 : 0.0)
                  << std::endl;
      } else {
        std::cout << fmt::format("receiver {}: FAILED: {}", r.address, r.error) << std::endl;
      }
    }
    const double aggregate = report.seconds > 0
                                 ? static_cast<double>(report.bytes) * committed / report.seconds / 1e6
                                 : 0.0;
    std::cout << fmt::format(
                     "pushed {} tensors, {:.1f} MiB to {}/{} receivers in {:.3f} s ({:.1f} MB/s "
                     "aggregate)",
                     tensors.size(), report.bytes / 1048576.0, committed, report.receivers.size(),
                     report.seconds, aggregate)
              << std::endl;
    return committed == report.receivers.size() ? 0 : 1;
  };
}

}  // namespace ferry::cli
