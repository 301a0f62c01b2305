// bench/store/store.hpp: `ferry bench store`: the CUDA weight store's release and resume, without
// backup (--gib, default 100) and with backup through the page-locked host mirror (--backup-gib,
// default 64), against a plain pinned cudaMemcpy of the same bytes measured in the same run. The
// measurement (store.cpp) is built with the cuda feature only; without it the case says so.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "bench/common/case.hpp"
#include "ferry_build_config.h"

namespace ferry::bench {

struct StoreBenchOptions {
  double gib = 100;             // --gib: without backup (less when the device has less free)
  double backup_gib = 64;       // --backup-gib: with backup (that much page-locked host RAM)
  std::uint64_t chunk_mib = 1024;  // --chunk-mib: physical chunk size of the regions
  int repeat = 5;               // --repeat: timed runs (the median is reported)
  bool exportable = true;       // --export 0|1: chunks with POSIX file descriptor export
  int settle_ms = 2000;         // --settle-ms: the second resume waits this long after release
  std::string json;             // --json PATH: the report
};

struct StoreBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench store` was given
  Action action;            // runs it: 0, 77 without a CUDA device, 2 without the cuda feature
};

// Adds `store` under `bench` with its options.
StoreBenchCommand add_store_bench_command(CLI::App* bench);

#if FERRY_HAVE_CUDA
// Prints the table and writes options.json; returns 0, or 77 ("skipped") without a CUDA
// device. Throws ferry::Error when a CUDA call fails or a restore lost weights.
int run_store_bench(const StoreBenchOptions& options);
#endif

}  // namespace ferry::bench
