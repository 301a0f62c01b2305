// bench/store/store_command.cpp: the options of `ferry bench store` (see store.hpp), and the
// message that replaces the measurement in a build without the cuda feature.
#include <cstdio>
#include <memory>

#include "bench/store/store.hpp"

namespace ferry::bench {

StoreBenchCommand add_store_bench_command(CLI::App* bench) {
  auto o = std::make_shared<StoreBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "store", "the CUDA weight store's release and resume, with and without host backup, vs a "
               "pinned cudaMemcpy");
  cmd->add_option("--gib", o->gib, "GiB without backup (default 100; less when less is free)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--backup-gib", o->backup_gib,
                  "GiB with backup through the page-locked host mirror (default 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--chunk-mib", o->chunk_mib, "physical chunk size in MiB (default 1024)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", o->repeat, "timed runs; the median is reported (default 5)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--export", o->exportable,
                  "0: chunks without POSIX file descriptor export (default 1)");
  cmd->add_option("--settle-ms", o->settle_ms,
                  "the second resume waits this long after the release (default 2000)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", o->json, "write the report (a JSON object) to FILE");
  Action action = [o]() -> int {
#if FERRY_HAVE_CUDA
    return run_store_bench(*o);
#else
    std::fprintf(stderr,
                 "ferry bench store: measures the CUDA weight store; this build has no CUDA (the "
                 "cuda feature is off)\n");
    return 2;
#endif
  };
  return {cmd, std::move(action)};
}

}  // namespace ferry::bench
