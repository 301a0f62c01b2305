// bench/cases.cpp: the `bench` command of ferry-bench, `ferry bench [scatter|fingerprint|disk|...|
// store]`: parses the bench options, guards the run with a watchdog, prints the chosen case's
// table and writes its JSON records (bench/README.md). With no case it lists the cases.
#include <cstdio>
#include <memory>
#include <string>

#include "bench/cases.hpp"
#include "bench/common/report.hpp"
#include "bench/cuda_ipc/cuda_ipc.hpp"
#include "bench/disk/disk.hpp"
#include "bench/embedded/embedded.hpp"
#include "bench/fingerprint/fingerprint.hpp"
#include "bench/fp8/fp8.hpp"
#include "bench/moe/moe.hpp"
#include "bench/nccl/nccl.hpp"
#include "bench/rl_step/rl_step.hpp"
#include "bench/scatter/scatter.hpp"
#include "bench/sharded/sharded.hpp"
#include "bench/store/store.hpp"
#include "bench/ucx/ucx.hpp"
#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include "bench/common/cuda.hpp"
#endif

namespace ferry::bench {
namespace {

void list_cases() {
  std::printf(
      "ferry bench: cases (`ferry bench <case> --help` lists the options; bench/README.md)\n"
      "  scatter      one-launch scatter of a bucket into many parameters vs a flat D2D copy of\n"
      "               the same bytes and torch (_foreach_copy_, per-tensor copy_ loop):\n"
      "               moe-3mib (9216 x 3 MiB bf16) and tiny-8kib (20,000 x 8 KiB)\n"
      "  fingerprint  xxh64-interleaved-v1 rate on the GPU (8 GiB) vs the CPU twin (1 GiB\n"
      "               sample), checking both give the same value\n"
      "  disk         load a multi-GiB safetensors checkpoint into GPU memory through the\n"
      "               receiver vs safetensors.torch.load_file(device=\"cuda\")\n"
      "  ucx          buckets of 1 MiB to 1 GiB through the UCX plugin between two processes\n"
      "               (tcp, shared memory) vs ucx_perftest ucp_put_bw / tag_bw (CPU only)\n"
      "  nccl         buckets of 64 MiB to 4 GiB broadcast through the nccl plugin vs a plain\n"
      "               ncclBroadcast of the same buffers; one process per GPU, needs 2+ GPUs\n"
      "  fp8          FP8 e4m3 128x128 block quantization of 4 GiB of bf16 matrices vs the\n"
      "               memory roofline (a flat D2D copy) and the obvious torch code\n"
      "  moe          a Qwen3-30B-A3B MoE update (48 layers x 128 experts) planned by the moe\n"
      "               plugin, one scatter per layer bucket, vs a copy_ loop and _foreach_copy_\n"
      "  cuda_ipc     a 16 GiB update (256 and 4096 tensors) through CUDA IPC into a ferry serve\n"
      "               child on the same GPU vs the D2D ceiling and torch.multiprocessing\n"
      "  embedded     a real-model RL push from Python (bench/embedded_push.py): a trainer's\n"
      "               Qwen3 (8B dims, 5 layers, 4.4 GB) state_dict right after optimizer.step()\n"
      "               into a rollout process's default ferry.Receiver on the same GPU vs D2D\n"
      "  sharded      a sharded trainer's push (bench/sharded_push.py): 1, 2, 4 sender processes\n"
      "               holding dim-0 shards of a Qwen3-8B-shaped model into 2 ferry serve\n"
      "               receivers vs one sender holding it whole, same run (and D2D on a GPU)\n"
      "  rl-step      the colocated RL step (bench/rl_step.py): engines release, the trainer\n"
      "               steps, engines resume, the trainer pushes; dense, MoE, MoE into FP8 and\n"
      "               TP=2 vs D2D and torch's flattened-bucket IPC, same run\n"
      "  store        the CUDA weight store's release and resume (100 GiB; 64 GiB with backup\n"
      "               through the page-locked host mirror) vs a plain pinned cudaMemcpy\n"
      "common options: --device cuda|cpu (default %s), --json FILE, --repeat N, --warmup N,\n"
      "                --timeout S\n",
      FERRY_HAVE_CUDA ? "cuda" : "cpu");
}

// Options both cases take.
void add_common_options(CLI::App* sub, BenchOptions* o, std::string* device) {
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

Action add_bench_command(CLI::App& app, const GlobalOptions& globals) {
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "measure the data-movement kernels against their ceilings and torch baselines");
  auto options = std::make_shared<BenchOptions>();
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
      "fingerprint", "xxh64-interleaved-v1 rate on the GPU vs the CPU twin");
  add_common_options(fingerprint, options.get(), device.get());
  fingerprint->add_option("--gib", options->gib, "GiB to fingerprint (cuda 8, cpu 1)")
      ->check(CLI::PositiveNumber);

  auto disk_options = std::make_shared<DiskOptions>();
  CLI::App* disk = bench_cmd->add_subcommand(
      "disk", "load a multi-GiB safetensors checkpoint to the GPU vs safetensors.torch.load_file");
  add_common_options(disk, options.get(), device.get());
  disk->add_option("--gib", disk_options->gib, "checkpoint GiB (cuda 8, cpu 1)")
      ->check(CLI::PositiveNumber);
  disk->add_option("--work-dir", disk_options->work_dir,
                   "folder for the checkpoint (default: a new folder under /tmp)");
  disk->add_flag("--keep", disk_options->keep, "keep the checkpoint afterwards");
  disk->add_option("--python", options->python, "interpreter for bench/torch_baselines.py");
  disk->add_option("--torch-script", options->torch_script, "path of torch_baselines.py");
  disk->add_flag("--no-torch", options->no_torch, "skip the torch baseline");

  CLI::App* fp8 = bench_cmd->add_subcommand(
      "fp8", "FP8 block quantization of bf16 matrices vs the memory roofline and torch");
  add_common_options(fp8, options.get(), device.get());
  fp8->add_option("--gib", options->gib, "GiB of bf16 to quantize (cuda 4, cpu 0.125)")
      ->check(CLI::PositiveNumber);
  CLI::App* moe = bench_cmd->add_subcommand(
      "moe", "a Qwen3-30B-A3B-shaped MoE update into stacked experts vs torch copies");
  add_common_options(moe, options.get(), device.get());
  moe->add_option("--count", options->count, "layers (default 48 on cuda, 2 on cpu)")
      ->check(CLI::PositiveNumber);
  for (CLI::App* sub : {fp8, moe}) {
    sub->add_option("--python", options->python, "interpreter for bench/torch_baselines.py");
    sub->add_option("--torch-script", options->torch_script, "path of torch_baselines.py");
    sub->add_flag("--no-torch", options->no_torch, "skip the torch baseline");
  }

  const UcxBenchCommand ucx = add_ucx_bench_command(bench_cmd, globals);
  const NcclBenchCommand nccl = add_nccl_bench_command(bench_cmd, globals);
  const CudaIpcBenchCommand cuda_ipc = add_cuda_ipc_bench_command(bench_cmd, globals);
  const EmbeddedBenchCommand embedded = add_embedded_bench_command(bench_cmd);
  const ShardedBenchCommand sharded = add_sharded_bench_command(bench_cmd);
  const RlStepBenchCommand rl_step = add_rl_step_bench_command(bench_cmd);
  const StoreBenchCommand store = add_store_bench_command(bench_cmd);

  return [options, device, scatter, fingerprint, disk, disk_options, ucx, nccl, cuda_ipc, embedded,
          sharded, rl_step, store, fp8, moe, &globals]() -> int {
    if (ucx.app->parsed()) return ucx.action();  // its own options, watchdog and JSON
    if (nccl.app->parsed()) return nccl.action();  // likewise
    if (cuda_ipc.app->parsed()) return cuda_ipc.action();  // likewise
    if (embedded.app->parsed()) return embedded.action();  // likewise
    if (sharded.app->parsed()) return sharded.action();  // likewise
    if (rl_step.app->parsed()) return rl_step.action();  // likewise
    if (store.app->parsed()) return store.action();  // its own options and JSON
    if (!scatter->parsed() && !fingerprint->parsed() && !disk->parsed() && !fp8->parsed() &&
        !moe->parsed()) {
      list_cases();
      return 0;
    }
    options->device = *device == "cpu" ? Device::cpu : Device::cuda;
    Watchdog watchdog(options->timeout_s);
#if FERRY_HAVE_CUDA
    if (options->device == Device::cuda) select_cuda_device();
#endif
    Json records = Json::array();
    int code = 0;
    try {
      if (disk->parsed()) {
        code = run_disk_bench(*options, *disk_options, globals, records);
      } else if (fp8->parsed()) {
        code = run_fp8_bench(*options, records);
      } else if (moe->parsed()) {
        code = run_moe_bench(*options, globals, records);
      } else {
        code = scatter->parsed() ? run_scatter_bench(*options, records)
                                 : run_fingerprint_bench(*options, records);
      }
    } catch (...) {
      // Keep what was measured before the failure.
      if (!options->json_path.empty() && !records.empty()) {
        write_records(options->json_path, records);
      }
      throw;
    }
    if (!options->json_path.empty()) {
      write_records(options->json_path, records);
      std::printf("\nrecords written to %s\n", options->json_path.c_str());
    }
    return code;
  };
}

}  // namespace ferry::bench
