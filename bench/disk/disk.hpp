// bench/disk/disk.hpp: `ferry bench disk`: loads a multi-GiB sharded safetensors checkpoint (Qwen3
// names, bf16) into device memory through the receiver (disk transport, parallel reads into
// page-locked staging, pipelined H2D, one-launch scatter, fingerprints) and compares it with
// `safetensors.torch.load_file(device="cuda")` on the same files in the same run
// (bench/torch_baselines.py --case disk). Prints a table and writes JSON records.
#pragma once

#include <string>

#include "bench/common/case.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct DiskOptions {
  double gib = 0;        // checkpoint size (cuda 8, cpu 1)
  std::string work_dir;  // where the checkpoint is written (default: a folder under /tmp)
  bool keep = false;     // keep the checkpoint afterwards
};

// Runs the case; appends one record to `records`. Returns the exit code (0, or 1 when ferry's
// load could not be verified).
int run_disk_bench(const BenchOptions& options, const DiskOptions& disk,
                   const GlobalOptions& globals, Json& records);

}  // namespace ferry::bench
