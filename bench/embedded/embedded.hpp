// bench/embedded/embedded.hpp: `ferry bench embedded`: an RL weight update as users run it from
// Python, timed by bench/embedded_push.py in a child process: a trainer holding a Hugging Face
// Qwen3 model with Qwen3-8B's dimensions on cuda:0 pushes model.state_dict() right after
// optimizer.step() (no synchronize) through a kept ferry.Sender into a rollout process whose
// parameters are registered with a default ferry.Receiver, against the D2D copy ceiling of the
// same bytes in the same run; or (--path sglang-tensor) the same model sent the way verl and slime
// drive SGLang (/update_weights_from_tensor per flattened bucket) into that receiver's control
// server, against SGLang's own receive of the same calls (unpickle + copy_) in the same run.
// Prints a table, writes JSON records (bench/README.md); exits 0 when
// verified (or when the script reports torch, CUDA or transformers unavailable), 1 on a wrong
// result or a failed run, 2 when the script is not found.
#pragma once

#include <string>

#include "bench/common/case.hpp"
#include "bench/common/python_script.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct EmbeddedBenchOptions : ScriptBenchOptions {
  std::string model = "qwen3";     // qwen3 (Qwen3-8B dims) or qwen3-moe (Qwen3-30B-A3B dims)
  int layers = 5;                  // decoder layers (5: 4.42 GB of bf16)
  bool lend = false;               // the rollout lends its GPU before every push after the first
  int steps = 8;                   // optimizer steps, each followed by a push
  std::string delivery = "auto";   // the Sender's update.delivery (auto: not set)
  std::string path = "push";       // push, or sglang-tensor (/update_weights_from_tensor)
  int bucket_mib = 512;            // sglang-tensor: flattened bucket size
  std::string device = "cuda";     // cuda; cpu runs the script's own CPU check (tiny model)
};

struct EmbeddedBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench embedded` was given
  Action action;            // runs it with its own watchdog and JSON records
};

// Adds `embedded` under `bench` with its options.
EmbeddedBenchCommand add_embedded_bench_command(CLI::App* bench);

// Runs the bench; appends its record to `records`. Returns the exit code described above.
int run_embedded_bench(const EmbeddedBenchOptions& options, Json& records);

}  // namespace ferry::bench
