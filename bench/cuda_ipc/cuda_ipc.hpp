// bench/cuda_ipc/cuda_ipc.hpp: `ferry bench cuda_ipc`: a colocated weight update, end to end (push
// called to commit acknowledged), from this process holding the trainer's CUDA tensors into a
// `ferry serve --device cuda:0` child on the same GPU through the cuda_ipc transport (each mode
// the session offers), against in the same run the D2D copy ceiling of the same bytes and the two
// ways users hand weights over today with torch.multiprocessing (per tensor; one flattened bucket,
// bench/torch_baselines.py --case cuda_ipc). Prints a table, writes JSON records
// (bench/README.md), exits 1 on a wrong result and 2 without a GPU.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/case.hpp"
#include "bench/common/report.hpp"
#include "ferry_build_config.h"

namespace ferry::bench {

struct CudaIpcBenchOptions {
  std::string device = "cuda";  // cuda; cpu checks the bench itself (host tensors, CPU receiver)
  double total_gib = 0;         // bytes per update; 0: 16 on cuda, 1/16 on cpu
  std::vector<std::uint64_t> tensor_counts = {256, 4096};
  std::vector<std::string> modes;  // empty: {"auto"} (the session chooses)
  std::string transport;           // empty: cuda_ipc on cuda, inline on cpu
  std::uint64_t bucket_bytes = 0;  // 0: the config's update.bucket_bytes
  std::uint64_t group_bytes = 0;   // 0: SenderOptions::fingerprinted_group_bytes
  // The sender's CUDA tensors: "per-tensor" (one cudaMalloc each) or "flat" (carved from one
  // allocation, as FSDP and Megatron keep parameters).
  std::string sender_memory = "per-tensor";
  // How push() orders its reads after the tensors' producer: sync_devices (what a caller that
  // names no stream gets) or none (the bench's fill synchronised already; ferry's own cost).
  std::string producer_order = "sync_devices";
  int repeat = 0;                  // timed pushes after the first; 0: 5 on cuda, 3 on cpu
  // The colocated RL loop ([one-pass] rl-step, dense case): before each timed push the receiver
  // releases `weights` and `kv_cache`, the trainer allocates, writes and frees a buffer of the
  // update's size and writes its new weights (its training step), the receiver resumes; then at
  // once the push.
  bool release_each_step = false;
  // With release_each_step: the Sender does not rejoin its suspended session (the receiver
  // closes it at each release and each push opens a new one: what a release cost before).
  bool no_rejoin = false;
  std::string json_path;
  int timeout_s = 570;
  // The torch baselines (the common bench options of the same names).
  std::string python = "python3";
  std::string torch_script;
  bool no_torch = false;
  int baseline_timeout_s = 300;
};

// Runs the bench; appends one record per tensor count to `records`. Returns 0 when every result
// was verified, 1 when one was wrong or a push failed, 2 when no GPU (or no CUDA) makes it
// impossible.
int run_cuda_ipc_bench(const GlobalOptions& globals, const CudaIpcBenchOptions& options,
                       Json& records);

struct CudaIpcBenchCommand {
  CLI::App* app = nullptr;  // parsed() when `ferry bench cuda_ipc` was given
  Action action;            // runs it with its own watchdog and JSON records
};

// Adds `cuda_ipc` under `bench` with its options; `globals` must outlive the action.
CudaIpcBenchCommand add_cuda_ipc_bench_command(CLI::App* bench, const GlobalOptions& globals);

// ---- the sender's tensors and the copy ceiling, per device (cuda_ipc_cuda.cpp for CUDA)

// `count` tensors of `bytes` bytes each, one allocation per tensor (as a trainer's parameters
// are), on the device or the host.
class SenderTensors {
 public:
  virtual ~SenderTensors() = default;
  // Writes new weights (the bench pattern seeded by `seed` and the tensor index); complete on
  // return, so that a push may read them.
  virtual void fill(std::uint64_t seed) = 0;
  virtual const void* data(std::size_t index) const = 0;
  // xxh64-interleaved-v1 of tensor `index` (what the receiver must report for it).
  virtual std::uint64_t fingerprint(std::size_t index) const = 0;
  virtual ferry_memory_kind_t memory_kind() const = 0;
  virtual std::size_t count() const = 0;
};

std::unique_ptr<SenderTensors> make_host_tensors(std::size_t count, std::uint64_t bytes);

// The flat copy of `bytes` bytes between two buffers of the device (cudaMemcpyAsync D2D, CUDA
// events) or the host (memcpy): seconds of each of `repeat` runs after one warm-up. Throws
// CORRUPT_DATA when the copy does not equal its source.
std::vector<double> measure_copy_ceiling_host(std::uint64_t bytes, int repeat);
#if FERRY_HAVE_CUDA
std::unique_ptr<SenderTensors> make_cuda_tensors(std::size_t count, std::uint64_t bytes,
                                                 bool flat);
std::vector<double> measure_copy_ceiling_cuda(std::uint64_t bytes, int repeat);
// The trainer's step between a release and a resume: allocates `bytes` bytes of device memory,
// writes them, frees them (the memory the engine lent goes through the trainer's hands).
void borrow_device_memory(std::uint64_t bytes);
#endif

}  // namespace ferry::bench
