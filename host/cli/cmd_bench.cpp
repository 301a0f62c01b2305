// cli/cmd_bench.cpp: `ferry bench [scatter|fingerprint]`: parses the bench options, guards the
// run with a watchdog, prints the chosen case's table and writes its JSON records
// (bench/README.md). With no case it lists the cases.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/bench_fingerprint.hpp"
#include "cli/bench_report.hpp"
#include "cli/bench_scatter.hpp"
#include "cli/command.hpp"
#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include "cli/bench_cuda.hpp"
#endif

namespace ferry::cli {
namespace {

void list_cases() {
  std::printf(
      "ferry bench: cases (`ferry bench <case> --help` lists the options; bench/README.md)\n"
      "  scatter      one-launch scatter of a bucket into many parameters vs a flat D2D copy of\n"
      "               the same bytes and torch (_foreach_copy_, per-tensor copy_ loop):\n"
      "               moe-3mib (9216 x 3 MiB bf16) and tiny-8kib (20,000 x 8 KiB)\n"
      "  fingerprint  xxh64-chunked-v1 rate on the GPU (8 GiB) vs the CPU twin (1 GiB sample),\n"
      "               checking both give the same value\n"
      "common options: --device cuda|cpu (default %s), --json FILE, --repeat N, --warmup N,\n"
      "                --timeout S\n",
      FERRY_HAVE_CUDA ? "cuda" : "cpu");
}

// Options both cases take.
void add_common_options(CLI::App* sub, bench::BenchOptions* o, std::string* device) {
  sub->add_option("--device", *device, "cuda or cpu (cpu runs small sizes)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  sub->add_option("--json", o->json_path, "write the records (a JSON array) to FILE");
  sub->add_option("--repeat", o->repeat, "timed runs; the median is reported (cuda 20, cpu 5)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--warmup", o->warmup, "untimed runs first (cuda 3, cpu 1)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--timeout", o->timeout_s,
                  "give up (exit 3) after this many seconds, whatever hangs (default 570)")
      ->check(CLI::PositiveNumber);
}

}  // namespace

Action add_bench_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "measure the data-movement kernels against their ceilings and torch baselines");
  auto options = std::make_shared<bench::BenchOptions>();
  auto device = std::make_shared<std::string>(FERRY_HAVE_CUDA ? "cuda" : "cpu");

  CLI::App* scatter = bench_cmd->add_subcommand(
      "scatter", "one-launch scatter of a bucket into many parameters (moe-3mib, tiny-8kib)");
  add_common_options(scatter, options.get(), device.get());
  scatter->add_option("--count", options->count, "tensors per case (overrides the case's count)")
      ->check(CLI::PositiveNumber);
  scatter->add_option("--only", options->only, "run one case: moe-3mib or tiny-8kib");
  scatter->add_option("--python", options->python, "interpreter for bench/torch_baselines.py");
  scatter->add_option("--torch-script", options->torch_script,
                      "path of torch_baselines.py (default: searched, see bench/README.md)");
  scatter->add_flag("--no-torch", options->no_torch, "skip the torch baselines");
  scatter->add_option("--baseline-timeout", options->baseline_timeout_s,
                      "kill the torch baseline process after this many seconds (default 300)")
      ->check(CLI::PositiveNumber);

  CLI::App* fingerprint = bench_cmd->add_subcommand(
      "fingerprint", "xxh64-chunked-v1 rate on the GPU vs the CPU twin");
  add_common_options(fingerprint, options.get(), device.get());
  fingerprint->add_option("--gib", options->gib, "GiB to fingerprint (cuda 8, cpu 1)")
      ->check(CLI::PositiveNumber);

  return [options, device, scatter, fingerprint]() -> int {
    if (!scatter->parsed() && !fingerprint->parsed()) {
      list_cases();
      return 0;
    }
    options->device = *device == "cpu" ? bench::Device::cpu : bench::Device::cuda;
    bench::Watchdog watchdog(options->timeout_s);
#if FERRY_HAVE_CUDA
    if (options->device == bench::Device::cuda) bench::select_cuda_device();
#endif
    bench::Json records = bench::Json::array();
    int code = 0;
    try {
      code = scatter->parsed() ? bench::run_scatter_bench(*options, records)
                               : bench::run_fingerprint_bench(*options, records);
    } catch (...) {
      // Keep what was measured before the failure.
      if (!options->json_path.empty() && !records.empty()) {
        bench::write_records(options->json_path, records);
      }
      throw;
    }
    if (!options->json_path.empty()) {
      bench::write_records(options->json_path, records);
      std::printf("\nrecords written to %s\n", options->json_path.c_str());
    }
    return code;
  };
}

}  // namespace ferry::cli
