// bench/scatter/scatter.hpp: `ferry bench scatter`: the batched scatter of one bucket into many
// parameters (one kernel launch) against the flat copy of the same bytes (the ceiling) and the
// PyTorch ways of doing it (a per-tensor copy_ loop, torch._foreach_copy_). The layout and the
// plan are shared by the CPU and CUDA measurements, each in its own file.
#pragma once

#include <ferry/kernels/cpu.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/report.hpp"

namespace ferry::bench {

// A bucket of `count` bf16 tensors of `tensor_bytes` each, back to back (as a transport delivers
// them), scattered into `count` destination slots of a region, `slot_bytes` apart (a tensor and
// kSlotGapBytes of poison after it). Tensor i goes to slot slot_of[i], a fixed shuffle, since an
// engine's parameters are not allocated in bucket order. One COPY op per tensor.
struct ScatterLayout {
  std::uint64_t count = 0;
  std::uint64_t tensor_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::vector<std::uint32_t> slot_of;
  std::vector<ferry_plan_op_t> ops;

  std::uint64_t bucket_bytes() const noexcept { return count * tensor_bytes; }
  std::uint64_t region_bytes() const noexcept { return count * slot_bytes; }
};

// Throws INVALID_ARGUMENT unless 0 < count < 2^32 and tensor_bytes is even and positive.
ScatterLayout make_scatter_layout(std::uint64_t count, std::uint64_t tensor_bytes);

// The plan's views of the bucket (entry i = tensor i) and of the region (param j = slot j).
std::vector<kernels::EntryView> scatter_entries(const ScatterLayout& layout,
                                                const std::byte* bucket);
std::vector<kernels::ParamView> scatter_params(const ScatterLayout& layout, std::byte* region);

// The tensors checked byte by byte on the host: the first, the last and a fixed random few.
std::vector<std::uint64_t> sample_tensors(std::uint64_t count, std::size_t how_many);

// What one device measured for one case. Times are seconds per run.
struct ScatterMeasurement {
  std::uint64_t count = 0;    // tensors measured; below the requested count only with `note`
  std::string note;           // why the count was scaled down, or ""
  std::vector<double> ferry_s;         // one scatter of the whole bucket
  std::vector<double> ferry_submit_s;  // host time until the scatter call returned
  std::vector<double> flat_s;          // one flat copy of the bucket's bytes
  bool verified = false;
  std::string verification;  // what was checked, or what failed
};

// Measures on the CPU with scatter_cpu (all hardware threads) against a memcpy of the same bytes
// split over the same number of threads.
ScatterMeasurement measure_scatter_cpu(std::uint64_t count, std::uint64_t tensor_bytes,
                                       int warmup, int repeat, std::uint64_t seed);

// Measures on the current CUDA device with scatter_cuda against one cudaMemcpyAsync D2D, timed
// with CUDA events. Scales `count` down (and says so in `note`) when the GPU lacks the memory.
// Built with the cuda feature only.
ScatterMeasurement measure_scatter_cuda(std::uint64_t count, std::uint64_t tensor_bytes,
                                        int warmup, int repeat, std::uint64_t seed);

// Runs `ferry bench scatter`: each case, its baselines, the table and the targets on stdout,
// one record per case appended to `records`. Returns 0, or 1 when a result failed verification.
int run_scatter_bench(const BenchOptions& options, Json& records);

}  // namespace ferry::bench
