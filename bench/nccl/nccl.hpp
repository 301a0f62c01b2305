// bench/nccl/nccl.hpp: `ferry bench nccl`: bucketed broadcast through the nccl transport plugin
// (BroadcastGroup: rendezvous, non-blocking communicator, deadline-polled waits) against a plain
// blocking ncclBroadcast of the same device buffers in the same run, bucket sizes 64 MiB..4 GiB;
// also the plain broadcast on a non-blocking communicator (the plugin's mode: it tells NCCL's
// per-call cost in that mode from ferry's), and bursts of buckets as an update runs them (ferry
// two in flight vs plain enqueued back to back).
// One process per GPU: rank 0 (the command the user runs) starts ranks 1..N-1 as child processes
// of the same executable. With fewer than two GPUs it says so and fails (NCCL refuses two ranks
// on one GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/case.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct NcclBenchOptions {
  std::uint32_t world_size = 0;  // 0: every visible GPU
  std::vector<std::string> sizes = {"64MiB", "256MiB", "1GiB", "4GiB"};
  std::uint16_t master_port = 29517;  // rank 0's rendezvous; the baseline uses the next port
  int repeat = 10;
  int warmup = 3;
  std::string json_path;
  int timeout_s = 570;
};

// Runs the benchmark as rank 0 (or as the child rank named by FERRY_BENCH_NCCL_RANK). Returns
// the exit code: 0, or 2 when fewer than two GPUs (or no NCCL) make it impossible.
int run_nccl_bench(const GlobalOptions& globals, const NcclBenchOptions& options, Json& records);

struct NcclBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench nccl` was given
  Action action;            // runs it with its own watchdog and JSON records
};

// Adds `nccl` under `bench` with its options; `globals` must outlive the action.
NcclBenchCommand add_nccl_bench_command(CLI::App* bench, const GlobalOptions& globals);

}  // namespace ferry::bench
