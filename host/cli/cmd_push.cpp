// cli/cmd_push.cpp: `ferry push`: the trainer side from the command line: pushes a safetensors
// checkpoint (or synthetic Qwen3-shaped weights) as one versioned update to one or many receivers
// through the session protocol, and prints per-receiver results and throughput; progress on
// standard error while it runs.
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
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
  // Playing one rank of a sharded trainer (docs/sharded.md).
  std::optional<std::uint32_t> rank;
  std::optional<std::uint32_t> world;
  std::string shard_by = "dim0";
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

// The part of a checkpoint that rank `rank` of `world` holds, split deterministically (every
// rank computes the same split from the same checkpoint):
//  - "tensor": whole tensors, each to the rank with the fewest bytes so far, largest first
//    (ties: by name, then the lowest rank);
//  - "dim0": every tensor of at least `world` rows in `world` row ranges (rank r: rows
//    [r*n/world, (r+1)*n/world)); smaller tensors and scalars are held by every rank, sent by
//    rank 0 (the others declare them as replicas).
std::vector<session::TensorView> shard_views(std::vector<session::TensorView> whole,
                                             std::uint32_t rank, std::uint32_t world,
                                             const std::string& by) {
  std::vector<session::TensorView> out;
  if (by == "tensor") {
    std::vector<std::size_t> order(whole.size());
    std::vector<std::uint64_t> sizes(whole.size());
    for (std::size_t i = 0; i < whole.size(); ++i) {
      order[i] = i;
      sizes[i] = byte_size(whole[i].dtype, whole[i].shape).value_or(0);
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return sizes[a] != sizes[b] ? sizes[a] > sizes[b] : whole[a].name < whole[b].name;
    });
    std::vector<std::uint64_t> load(world, 0);
    std::vector<bool> mine(whole.size(), false);
    for (std::size_t i : order) {
      const auto r = static_cast<std::uint32_t>(
          std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += sizes[i];
      mine[i] = r == rank;
    }
    for (std::size_t i = 0; i < whole.size(); ++i) {
      if (!mine[i]) continue;
      whole[i].global_shape = whole[i].shape;
      out.push_back(std::move(whole[i]));
    }
    return out;
  }
  if (by != "dim0") {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "--shard-by '{}': must be tensor or dim0", by);
  }
  for (auto& t : whole) {
    t.global_shape = t.shape;
    if (t.shape.empty() || t.shape[0] < world) {
      t.replica = rank != 0;
      out.push_back(std::move(t));
      continue;
    }
    const std::uint64_t rows = t.shape[0];
    const std::uint64_t begin = rows * rank / world;
    const std::uint64_t end = rows * (rank + 1) / world;
    const std::uint64_t row_bytes = byte_size(t.dtype, t.shape).value_or(0) / rows;
    t.offsets.assign(t.shape.size(), 0);
    t.offsets[0] = begin;
    t.shape[0] = end - begin;
    t.data = static_cast<const std::uint8_t*>(t.data) + begin * row_bytes;
    out.push_back(std::move(t));
  }
  return out;
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
  auto* rank = cmd->add_option("--rank", o->rank,
                               "play rank R of a sharded trainer: push only this rank's part of "
                               "the checkpoint (with --world; docs/sharded.md)");
  auto* world = cmd->add_option("--world", o->world, "the sharded trainer's number of ranks");
  rank->needs(world);
  world->needs(rank);
  cmd->add_option("--shard-by", o->shard_by,
                  "how the checkpoint is split over the ranks: tensor (whole tensors) or dim0 "
                  "(row ranges; default)");
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

    if (o->world) {
      if (*o->world == 0 || *o->rank >= *o->world) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "--rank {} of --world {}: need 0 <= rank < world",
             *o->rank, *o->world);
      }
      options.shard_rank = *o->rank;
      options.shard_world = *o->world;
      tensors = shard_views(std::move(tensors), *o->rank, *o->world, o->shard_by);
      if (tensors.empty()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "rank {} of {} holds no tensor of this checkpoint (--shard-by {}): use fewer ranks",
             *o->rank, *o->world, o->shard_by);
      }
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
        if (!r.rank_bytes.empty()) {
          std::string per_rank;
          std::uint64_t moved = 0;
          for (std::size_t k = 0; k < r.rank_bytes.size(); ++k) {
            per_rank += fmt::format("{}{}", k ? " " : "", r.rank_bytes[k]);
            moved += r.rank_bytes[k];
          }
          std::cout << fmt::format(
                           "receiver {}: sharded update of {} ranks: bytes moved per rank [{}], "
                           "{} moved, {} needed",
                           r.address, r.rank_bytes.size(), per_rank, moved, r.needed_bytes)
                    << std::endl;
        }
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
