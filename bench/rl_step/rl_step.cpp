// bench/rl_step/rl_step.cpp: `ferry bench rl-step` (see rl_step.hpp): runs bench/rl_step.py
// (bench/common/python_script.hpp) with this ferry as its engines' executable, then prints the
// table and appends the record.
#include "bench/rl_step/rl_step.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "bench/common/ferry_program.hpp"
#include "bench/common/python_script.hpp"

namespace ferry::bench {
namespace {

constexpr double kTarget = 0.70;      // [one-pass]: of D2D (FP8: of its roofline), every step
constexpr double kTorchTarget = 3.0;  // ... and this many times torch's flattened-bucket IPC

// The steps' path, and the first push's where it differs (a whole trainer into tensor-parallel
// ranks: reads in place, then only each rank's parts as rank 0 of 1).
std::string path_of(const Json& row) {
  const auto first = row.value("first_path", std::string("?"));
  const auto steps = row.value("path", first);
  return steps == first ? steps : first + ", then " + steps;
}

void print_result(const Json& d) {
  fmt::print(
      "\nbench rl-step on {}: {} steps per case, each after the engines released their "
      "memory, a training step took and freed {} and the engines resumed\n",
      d.value("device_name", std::string("?")), d.value("steps", 0),
      binary_size(d.value("train_bytes", std::uint64_t{0})));
  Table table({"case", "tensors", "bf16", "engine ranks", "path", "first push ms", "push ms",
               "ready ms", "ceiling ms", "of ceiling", "slowest step", "torch ms", "vs torch"});
  if (d.contains("rows") && d["rows"].is_array()) {
    for (const Json& row : d["rows"]) {
      table.add_row({row.value("case", std::string("?")), std::to_string(row.value("tensors", 0)),
                     decimal_bytes(row.value("model_bytes", 0.0)),
                     std::to_string(row.value("engine_ranks", 0)), path_of(row),
                     json_ms(row, "first_push_s"), json_ms(row, "push_median_s"),
                     json_ms(row, "ready_median_s"), json_ms(row, "ceiling_s"),
                     json_ratio(row, "ready_of_ceiling"), json_ratio(row, "worst_of_ceiling"),
                     json_ms(row, "torch_median_s"), json_ratio(row, "vs_torch")});
    }
  }
  std::printf("\n");
  table.print();
  fmt::print(
      "\npush ms: the push's call to its return (every engine rank committed), median of the "
      "steps; ready ms: from\nthe later of the call and the optimizer's kernels done. ceiling: "
      "the device copy of the bytes the engines\nwrite (moe-fp8: of the bytes read and written, "
      "halved), same run; of ceiling: over the median ready\ntime; slowest step: over the "
      "slowest step's; target >= {:.2f} every step.\ntorch: flattened buckets through "
      "CUDA IPC into torch engine processes loading them with torch ops\n(no lend); target >= "
      "{:.1f}x.\nverification: {}\n",
      kTarget, kTorchTarget, d.value("verification", std::string("?")));
}

}  // namespace

int run_rl_step_bench(const RlStepBenchOptions& o, Json& records) {
  Json record = record_header("rl-step", o.cases, Device::cpu);
  record["cases"] = o.cases;
  record["layers"] = o.layers;
  record["steps"] = o.steps;
  record["train_gib"] = o.train_gib;
  record["baseline_steps"] = o.baseline_steps;
  record["bucket_mib"] = o.bucket_mib;
  const std::string ferry =
      require_ferry_program("bench rl-step starts `ferry serve` engines").string();
  std::vector<std::string> args = {"--cases",          o.cases,
                                   "--layers",         std::to_string(o.layers),
                                   "--steps",          std::to_string(o.steps),
                                   "--train-gib",      fmt::format("{}", o.train_gib),
                                   "--baseline-steps", std::to_string(o.baseline_steps),
                                   "--bucket-mib",     std::to_string(o.bucket_mib),
                                   "--device",         o.device,
                                   "--ferry",          ferry,
                                   "--no-table"};
  if (!o.log_dir.empty()) args.insert(args.end(), {"--log-dir", o.log_dir});
  const ScriptRun run = run_bench_script("rl-step", "rl_step.py", o.script, o.python, args, record);
  if (run.exit_code == 2) return 2;
  if (!run.ran()) {
    records.push_back(record);
    return run.exit_code;
  }
  print_result(run.result);
  record["torch_target"] = kTorchTarget;
  return keep_script_result(run, "rl-step", o.cases, kTarget, record, records);
}

RlStepBenchCommand add_rl_step_bench_command(CLI::App* bench) {
  CLI::App* app = bench->add_subcommand(
      "rl-step",
      "the colocated RL step (bench/rl_step.py): engines release, the trainer steps, engines "
      "resume, the trainer pushes; dense, MoE, MoE into FP8, TP=2, vs D2D and torch IPC");
  auto o = std::make_shared<RlStepBenchOptions>();
  app->add_option("--cases", o->cases,
                  "comma-separated, of dense, moe, moe-fp8, tp2 (all), or tp2-pieces\n(tp2, the "
                  "trainer pushing as rank 0 of a 1-rank sharded update)");
  app->add_option("--layers", o->layers,
                  "decoder layers (0: 36 for dense and tp2, 16.4 GB; 12 for the MoE cases, "
                  "16.2 GB; 48 is all of Qwen3-30B-A3B)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--steps", o->steps, "lend + step + push cycles per case (5)")
      ->check(CLI::PositiveNumber);
  app->add_option("--train-gib", o->train_gib,
                  "what the training step allocates, writes and frees (8 GiB)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--baseline-steps", o->baseline_steps,
                  "steps of torch's flattened-bucket IPC (3; 0: none)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--bucket-mib", o->bucket_mib,
                  "the torch baseline's flattened bucket size in MiB (512)")
      ->check(CLI::PositiveNumber);
  app->add_option("--device", o->device, "cuda, or cpu (host tensors of tiny models)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app->add_option("--log-dir", o->log_dir,
                  "keep every engine's log and the trainer's Sender's here, at debug level, one "
                  "folder per case");
  add_script_bench_options(app, o.get(), "rl_step.py");
  Action action = [o]() -> int {
    return run_script_bench(*o, [&](Json& records) { return run_rl_step_bench(*o, records); });
  };
  return {app, action};
}

}  // namespace ferry::bench
