// bench/sharded/sharded.hpp: `ferry bench sharded`: a sharded trainer's push against the
// one-sender push of the same model in the same run, timed by bench/sharded_push.py in a child
// process: S sender processes (S = 1, 2, 4 ...), each holding a dim-0 shard of every tensor of a
// Qwen3-shaped model, push one version together into R `ferry serve` receivers, then one sender
// holding the whole model pushes the same values; every sharded version is checked equal to that
// push on every receiver, and bytes moved against bytes needed (with --tp the receivers are one
// engine's tensor-parallel ranks, each taking only what its plan reads). On a GPU (cuda:0, cuda_ipc) the
// times are also a ratio of the device copy of the bytes written; with --device cpu it runs over
// a host transport (UCX when built). Prints a table, writes JSON records (bench/README.md); exits
// 0 when verified (or when the script reports torch, CUDA or ferry unavailable), 1 on a wrong
// result or a failed run, 2 when the script is not found.
#pragma once

#include <string>

#include "bench/common/case.hpp"
#include "bench/common/python_script.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct ShardedBenchOptions : ScriptBenchOptions {
  std::string senders = "1,2,4";   // sender counts, one row each
  int receivers = 2;               // ferry serve receivers
  bool tp = false;                 // they are one engine's tensor-parallel ranks (dense layout)
  int layers = 36;                 // decoder layers (36: Qwen3-8B, 16.38 GB of bf16)
  int rounds = 3;                  // pushes per sender count (medians)
  std::string transport = "auto";  // the senders' transport
  int bucket_mib = 0;              // the sender ranks' bucket size (0: ferry's default)
  std::string delivery = "auto";   // the sender ranks' update.delivery (auto, direct, staged)
  std::string whole_delivery = "auto";  // the one sender's update.delivery
  std::string receiver_family;          // the receivers' model family ("": dense / identity)
  bool no_keep = false;            // the ranks open new sessions for every push
  bool lend = false;  // before each round the receivers release and resume their memory
  std::string device = "cuda";     // cuda (cuda:0); cpu: host tensors of a tiny model
  std::string log_dir;             // keep every process's debug log here (where time goes)
};

struct ShardedBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench sharded` was given
  Action action;
};

ShardedBenchCommand add_sharded_bench_command(CLI::App* bench);

int run_sharded_bench(const ShardedBenchOptions& options, Json& records);

}  // namespace ferry::bench
