// bench/disk/disk.cpp: `ferry bench disk` (see disk.hpp): writes the checkpoint, loads it
// through an in-process receiver on the chosen device (first load, then repeated reloads), checks
// every parameter's fingerprint against the bytes written, runs the torch baseline on the same
// files and prints the comparison.
#include "bench/disk/disk.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "bench/common/baseline.hpp"
#include "cli/context.hpp"
#include "config/config.hpp"
#include "demo/synthetic_model.hpp"
#include <ferry/formats/safetensors.hpp>
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kHidden = 4096;
constexpr std::uint64_t kVocab = 32768;
constexpr std::uint64_t kShardBytes = 2ull << 30;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint64_t model_bytes(const std::vector<demo::TensorSpec>& tensors) {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.elements * 2;
  return total;
}

// The Qwen3 shape with hidden 4096 whose bf16 checkpoint first reaches `bytes`.
demo::ModelShape shape_for(std::uint64_t bytes) {
  for (std::uint32_t layers = 1; layers < 1024; ++layers) {
    const auto shape = demo::ModelShape::from_sizes(kHidden, layers, kVocab);
    if (model_bytes(demo::qwen3_tensors(shape)) >= bytes) return shape;
  }
  return demo::ModelShape::from_sizes(kHidden, 1024, kVocab);
}

// Finite bf16 values from a per-range xorshift generator, filled by every core.
void fill_bf16(std::vector<std::uint8_t>& buffer, std::uint64_t seed) {
  const std::uint64_t words = buffer.size() / 8;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::uint64_t begin = words * t / threads;
      const std::uint64_t end = words * (t + 1) / threads;
      std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (begin + 1) * 0xBF58476D1CE4E5B9ull;
      for (std::uint64_t i = begin; i < end; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Clearing bit 14 of every bf16 keeps its exponent below 0x40: finite, |v| < 2.
        const std::uint64_t v = x & ~0x4000400040004000ull;
        std::memcpy(buffer.data() + i * 8, &v, 8);
      }
    });
  }
  for (auto& th : pool) th.join();
  for (std::uint64_t i = words * 8; i < buffer.size(); ++i) buffer[i] = 0x3f;
}

std::string config_json(const demo::ModelShape& s) {
  nlohmann::ordered_json c;
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["hidden_size"] = s.hidden;
  c["intermediate_size"] = s.intermediate;
  c["num_hidden_layers"] = s.layers;
  c["num_attention_heads"] = s.heads;
  c["num_key_value_heads"] = s.kv_heads;
  c["head_dim"] = s.head_dim;
  c["vocab_size"] = s.vocab;
  c["tie_word_embeddings"] = false;
  c["torch_dtype"] = "bfloat16";
  return c.dump(2);
}

// Writes the sharded checkpoint; returns the fingerprint of every tensor by name.
std::map<std::string, std::uint64_t> write_checkpoint(const fs::path& dir,
                                                      const demo::ModelShape& shape) {
  const auto tensors = demo::qwen3_tensors(shape);
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (in_shard >= kShardBytes && !shards.back().empty()) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += tensors[t].elements * 2;
  }
  fs::create_directories(dir);
  std::map<std::string, std::string> weight_map;
  std::map<std::string, std::uint64_t> fingerprints;
  std::vector<std::uint8_t> buffer;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    std::uint64_t bytes = 0;
    for (std::size_t t : shards[k]) bytes += tensors[t].elements * 2;
    buffer.resize(bytes);
    fill_bf16(buffer, k);
    const std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, shards.size());
    std::vector<safetensors::TensorData> data;
    std::uint64_t at = 0;
    for (std::size_t t : shards[k]) {
      const std::uint64_t n = tensors[t].elements * 2;
      std::span<const std::uint8_t> span(buffer.data() + at, n);
      data.push_back({tensors[t].name, FERRY_DTYPE_BF16, tensors[t].shape, span});
      fingerprints[tensors[t].name] = kernels::fingerprint_cpu(span.data(), n);
      weight_map[tensors[t].name] = file;
      at += n;
    }
    safetensors::write_safetensors((dir / file).string(), data, {{"format", "pt"}});
  }
  safetensors::write_index((dir / safetensors::kIndexFileName).string(), weight_map,
                           model_bytes(tensors));
  std::ofstream config(dir / "config.json");
  config << config_json(shape) << "\n";
  if (!config.flush()) fail(FERRY_STATUS_IO, "cannot write {}", (dir / "config.json").string());
  return fingerprints;
}

}  // namespace

int run_disk_bench(const BenchOptions& options, const DiskOptions& disk,
                   const GlobalOptions& globals, Json& records) {
  const bool cuda = options.device == Device::cuda;
  const double gib = disk.gib > 0 ? disk.gib : (cuda ? 8.0 : 1.0);
  const int repeat = options.repeat > 0 ? options.repeat : 5;
  const int warmup = options.warmup > 0 ? options.warmup : 1;
  const auto shape = shape_for(static_cast<std::uint64_t>(gib * (1ull << 30)));
  const auto tensors = demo::qwen3_tensors(shape);
  const std::uint64_t bytes = model_bytes(tensors);
  const fs::path dir =
      disk.work_dir.empty()
          ? fs::temp_directory_path() / fmt::format("ferry-bench-disk-{}", ::getpid())
          : fs::path(disk.work_dir);
  fs::create_directories(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  const auto space = fs::space(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  if (space.available < bytes + (1ull << 30)) {
    fail(FERRY_STATUS_OUT_OF_MEMORY,
         "bench disk: the {:.1f} GiB checkpoint does not fit in {} ({:.1f} GiB free); pass "
         "--work-dir or --gib",
         static_cast<double>(bytes) / (1ull << 30), dir.parent_path().string(),
         static_cast<double>(space.available) / (1ull << 30));
  }

  Watchdog::phase("writing the safetensors checkpoint");
  fmt::print("bench disk: writing a {} checkpoint (Qwen3 shape {}, {} bf16 tensors) to {}\n",
             decimal_bytes(static_cast<double>(bytes)), shape.key(), tensors.size(), dir.string());
  std::fflush(stdout);
  auto t = std::chrono::steady_clock::now();
  const auto expected = write_checkpoint(dir, shape);
  const double write_s = seconds_since(t);

  // ferry: an in-process receiver on the device, hf layout (checkpoint names, pure copies),
  // fingerprints of every parameter at each commit included.
  GlobalOptions g = globals;
  g.overrides.push_back(std::string("receiver.device=") + (cuda ? "cuda" : "cpu"));
  g.overrides.push_back("receiver.model_family=dense");
  g.overrides.push_back("receiver.layout=hf");
  // Like load_file: no host mirror copy at commit (policy backup would add a D2H of every byte).
  g.overrides.push_back("memory.weights_policy=discard");
  const config::Config config = load_config(g);
  const auto registry = make_registry(g, config);
  double first_s = 0;
  std::vector<double> reload_s;
  std::string verification;
  bool verified = false;
  {
    receiver::Receiver receiver(config, *registry);
    Watchdog::phase("ferry: first load (creates the layout and the weight store)");
    t = std::chrono::steady_clock::now();
    receiver.update_from_disk(dir, std::string("bench-first"));
    first_s = seconds_since(t);
    Watchdog::phase("ferry: reloads");
    for (int i = 0; i < warmup + repeat; ++i) {
      t = std::chrono::steady_clock::now();
      receiver.update_from_disk(dir, fmt::format("bench-{}", i));
      if (i >= warmup) reload_s.push_back(seconds_since(t));
    }
    Watchdog::phase("ferry: verifying the loaded weights");
    const auto actual = receiver.fingerprints();
    std::uint64_t wrong = 0;
    std::string first_wrong;
    for (const auto& [name, value] : expected) {
      auto it = actual.find(name);
      if (it == actual.end() || it->second != value) {
        if (wrong++ == 0) first_wrong = name;
      }
    }
    verified = wrong == 0 && actual.size() == expected.size();
    verification =
        verified ? fmt::format("all {} parameters' fingerprints (computed {}) equal the written "
                               "bytes'",
                               expected.size(), cuda ? "on the GPU" : "on the CPU")
                 : fmt::format("{} of {} parameters differ (first: {}); {} parameters loaded",
                               wrong, expected.size(), first_wrong, actual.size());
  }

  Baseline baseline;
  if (!options.no_torch) {
    Watchdog::phase("torch: safetensors.torch.load_file");
    baseline = run_torch_baseline(
        options, {"--case", "disk", "--device", cuda ? "cuda" : "cpu", "--path", dir.string(),
                  "--repeat", std::to_string(repeat), "--warmup", std::to_string(warmup)});
  } else {
    baseline.reason = "--no-torch";
  }
  std::optional<double> torch_s;
  if (baseline.available && baseline.data.contains("median_s")) {
    torch_s = baseline.data["median_s"].get<double>();
  }
  if (!disk.keep) fs::remove_all(dir);

  const double reload = median(reload_s);
  auto gbps = [&](double s) { return s > 0 ? static_cast<double>(bytes) / 1e9 / s : 0.0; };
  fmt::print("\nbench disk: {} in {} tensors ({} written in {:.1f} s; the page cache holds it for "
             "every reader below)\n\n",
             decimal_bytes(static_cast<double>(bytes)), tensors.size(), dir.string(), write_s);
  Table table({"method", "median s", "GB/s", "vs torch"});
  auto vs = [&](double s) {
    return torch_s && s > 0 ? fmt::format("{:.2f}x", *torch_s / s) : std::string("-");
  };
  table.add_row({fmt::format("ferry first load ({})", cuda ? "cuda" : "cpu"),
                 number(first_s, 3), number(gbps(first_s), 2), vs(first_s)});
  table.add_row({fmt::format("ferry reload, median of {}", repeat), number(reload, 3),
                 number(gbps(reload), 2), vs(reload)});
  table.add_row({fmt::format("safetensors.torch.load_file(device=\"{}\")", cuda ? "cuda" : "cpu"),
                 torch_s ? number(*torch_s, 3) : std::string("-"),
                 torch_s ? number(gbps(*torch_s), 2) : std::string("-"), torch_s ? "1.00x" : "-"});
  table.print();
  fmt::print("\nverification: {}\n", verification);
  if (!baseline.available) fmt::print("torch baseline: unavailable ({})\n", baseline.reason);

  Json record = record_header("disk", "qwen3-" + shape.key(), options.device);
  record["bytes"] = bytes;
  record["tensors"] = tensors.size();
  record["write_s"] = write_s;
  record["ferry_first_load_s"] = first_s;
  record["ferry_reload_s"] = reload_s;
  record["ferry_reload_median_s"] = reload;
  record["ferry_reload_gb_per_s"] = gbps(reload);
  record["verified"] = verified;
  record["verification"] = verification;
  Json torch;
  torch["available"] = baseline.available;
  if (!baseline.available) torch["reason"] = baseline.reason;
  torch["result"] = baseline.available ? baseline.data : Json(nullptr);
  record["torch"] = torch;
  if (torch_s && reload > 0) record["ferry_vs_torch"] = *torch_s / reload;
  records.push_back(record);
  return verified ? 0 : 1;
}

}  // namespace ferry::bench
