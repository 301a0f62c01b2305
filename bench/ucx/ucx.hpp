// bench/ucx/ucx.hpp: `ferry bench ucx`: buckets of 1 MiB to 1 GiB pushed through the UCX transport
// plugin between two processes of this host, per UCX transport (tcp; shared memory; cuda_ipc),
// in host memory or (--device cuda) GPU memory, next to ucx_perftest's ucp_put_bw and tag_bw on
// the same transport, memory type and sizes in the same run. Prints ferry's throughput, the best
// baseline, the ratio (target >= 70%) and the primitive the plugin chose; writes JSON records
// (bench/README.md).
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/common/case.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct UcxBenchOptions {
  std::vector<std::string> transports;  // --transports; empty: tcp,shm (cpu), cuda_ipc,tcp (cuda)
  std::string device = "cpu";           // --device: cpu (host buffers) or cuda (GPU 0 buffers)
  std::string primitive = "auto";  // --primitive: auto (the plugin's choice), put, tag
  std::string receiver_memory = "auto";  // --receiver-memory: auto (the plugin's alloc_memory
                                         // where it has one), host (allocated by the bench)
  std::vector<std::uint64_t> sizes;     // --sizes (bytes); empty: 1 MiB, 16 MiB, 256 MiB, 1 GiB
  std::uint64_t bytes_per_size = 1ull << 30;  // --bytes-per-size: iterations = this / size
  int min_iterations = 3;               // --min-iterations
  int max_iterations = 200;             // --max-iterations
  int slots = 0;  // --slots: buckets in flight; 0: as a session (2; 1 from 512 MiB)
  std::string perftest;                 // --perftest: the baseline program (see default_perftest)
  bool no_perftest = false;             // --no-perftest
  std::string json_path;                // --json
  int timeout_s = 570;                  // --timeout
  int perftest_timeout_s = 120;         // --perftest-timeout: one ucx_perftest pair
};

// The ucx_perftest of the UCX a bundle carries (bin/ucx_perftest beside the ferry executable,
// scripts/bundle), else "ucx_perftest" from PATH.
std::string default_perftest();

// Parses "1MiB", "16M", "1GiB", "4096" into bytes; throws INVALID_ARGUMENT naming the text.
std::uint64_t parse_size(const std::string& text);

// Runs the bench with the UCX plugin's table; appends one record per (transport, size) to
// `records`. Returns 0 when every measurement ran (whatever the ratios), 1 when one failed.
int run_ucx_bench(const UcxBenchOptions& options, const ferry_transport_api_t& api, Json& records);

// ---- ucx_perftest (ucx_perftest.cpp) ----

struct PerftestResult {
  std::optional<double> bytes_per_second;  // overall bandwidth of the "Final:" line
  std::string error;                       // why there is none
};

// Runs `ucx_perftest` as a server and a client on this host with UCX_TLS = `tls`, test `test`
// (ucp_put_bw, tag_bw), message `size`, `iterations` runs, buffers of `memory` ("host", "cuda":
// perftest's -m), with UCX peer error handling on its endpoints when `error_handling` (-e).
// Never throws for a failed baseline.
PerftestResult run_perftest(const std::string& program, const std::string& tls,
                            const std::string& test, std::uint64_t size, int iterations,
                            int timeout_s, const std::string& memory = "host",
                            bool error_handling = false);

// The receiver side of the bench in a process of its own: `ferry-bench` re-executes itself with
// the same arguments and FERRY_BENCH_UCX_RECEIVER="<fd> <transport>" (a fresh process, not a
// fork: CUDA, which UCX initialises when it loads its CUDA module, does not survive fork).
// Returns -1 when this process is not such a receiver, else its exit status.
int run_ucx_receiver_if_asked(const UcxBenchOptions& options, const ferry_transport_api_t& api);

// The overall bandwidth (bytes/s) of ucx_perftest's "Final:" line; nullopt when there is none.
// ucx_perftest prints MB/s meaning 2^20 bytes per second.
std::optional<double> parse_perftest_output(const std::string& output);

}  // namespace ferry::bench

// ---- the `ferry bench ucx` subcommand (ucx_command.cpp) ----
namespace ferry::bench {

struct UcxBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench ucx` was given
  Action action;            // runs it (loads the plugin through the registry)
};

// Adds `ucx` under `bench` with its options; `globals` must outlive the action.
UcxBenchCommand add_ucx_bench_command(CLI::App* bench, const GlobalOptions& globals);

}  // namespace ferry::bench
