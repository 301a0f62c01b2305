// bench/rl_step/rl_step.hpp: `ferry bench rl-step`: the colocated RL step as users run it, case
// by case, timed by bench/rl_step.py in a child process: the `ferry serve` engine ranks release
// their memory, the trainer's step takes and frees device memory, the engines resume, and the
// trainer pushes the weights its optimizer step just wrote (no synchronize first). Cases: dense
// (Qwen3-8B dims), moe (Qwen3-30B-A3B dims, experts stacked), moe-fp8 (the same into FP8 128x128
// blocks on arrival), tp2 (the dense model into two tensor-parallel ranks). Each step is checked
// equal to a staged push of the same values; on a GPU the times are a ratio of the device copy
// of the bytes written (FP8: of its read + write roofline) and of torch's flattened-bucket CUDA
// IPC of the same tensors in the same run. Prints a table, writes JSON records
// (bench/README.md); exits 0 when verified (or when the script reports torch, CUDA or ferry
// unavailable), 1 on a wrong result or a failed run, 2 when the script is not found.
#pragma once

#include <string>

#include "bench/common/case.hpp"
#include "bench/common/python_script.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct RlStepBenchOptions : ScriptBenchOptions {
  std::string cases = "dense,moe,moe-fp8,tp2";
  int layers = 0;               // 0: 36 for dense and tp2, 12 for the MoE cases (cpu: 1)
  int steps = 5;                // lend + step + push cycles per case
  double train_gib = 8.0;       // what the training step allocates, writes and frees
  int baseline_steps = 3;       // torch's flattened-bucket IPC steps (0: none)
  int bucket_mib = 512;         // the torch baseline's flattened bucket size
  std::string device = "cuda";  // cuda (cuda:0); cpu: host tensors of tiny models
  std::string log_dir;  // keep every engine's and the trainer's debug log here, one folder per case
};

struct RlStepBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench rl-step` was given
  Action action;
};

RlStepBenchCommand add_rl_step_bench_command(CLI::App* bench);

int run_rl_step_bench(const RlStepBenchOptions& options, Json& records);

}  // namespace ferry::bench
