// Host side of the CUDA FP8 block quantization (cuda.hpp): validates and resolves the plan with
// the CPU twin's code (cpu/fp8_jobs.hpp), then launches kernels/cuda/fp8.cu once per call.
#include "../cpu/fp8_jobs.hpp"
#include "ferry/kernels/cuda.hpp"
#include "ferry/kernels/fp8_block.hpp"

#include <ferry/sdk/error.hpp>

#include <limits>
#include <vector>

namespace ferry::kernels {
namespace fp8_detail {
cudaError_t launch_fp8(const Fp8Job* host_jobs, std::size_t num_jobs, std::uint64_t total_tiles,
                       cudaStream_t stream);
}  // namespace fp8_detail

void fp8_block_quant_cuda(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                          std::span<const ParamView> params, cudaStream_t stream) {
  const std::vector<fp8_detail::Fp8Job> jobs = fp8_jobs(ops, entries, params);
  if (jobs.empty()) return;
  if (jobs.size() > std::numeric_limits<std::uint32_t>::max()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "fp8_block_quant_cuda: {} ops exceed 2^32 - 1 per launch",
         jobs.size());
  }
  const auto& last = jobs.back();
  const std::uint64_t tiles = last.first_tile + fp8::blocks_of(last.rows) * last.tile_cols;
  const cudaError_t err = fp8_detail::launch_fp8(jobs.data(), jobs.size(), tiles, stream);
  if (err != cudaSuccess) {
    fail(err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "fp8_block_quant_cuda: launching the kernel: {} ({})", cudaGetErrorString(err),
         cudaGetErrorName(err));
  }
}

}  // namespace ferry::kernels
