// bench/common/baseline.hpp: runs the PyTorch baselines of `ferry bench` (bench/torch_baselines.py)
// as a child process with a deadline and reads the one JSON object it prints. A missing torch, a
// missing script or a failing run is an "unavailable" baseline with its reason, never an error of
// the bench.
#pragma once

#include <string>
#include <vector>

#include "bench/common/report.hpp"

namespace ferry::bench {

struct Baseline {
  bool available = false;
  std::string reason;  // why not, when !available (one line)
  std::string script;  // the script that ran (or was looked for)
  Json data;           // the script's JSON object when available
};

// Runs `<options.python> <script> <args...>`. The script is options.torch_script, else the first
// of bench/torch_baselines.py under the working directory, <exe>/../../../bench (the build tree)
// and <exe>/../bench (a bundle) that exists. The child is killed after
// options.baseline_timeout_s seconds (or sooner, before the bench's own watchdog fires).
Baseline run_torch_baseline(const BenchOptions& options, const std::vector<std::string>& args);

}  // namespace ferry::bench
