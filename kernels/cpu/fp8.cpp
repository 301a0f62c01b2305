// The CPU twin of FP8 e4m3 128x128 block quantization: validates FP8 plan ops against the
// scale-addressing convention (ferry/kernels/cpu.hpp) and quantizes tile by tile on a per-call
// thread pool; the reference the CUDA kernel (cuda/fp8.cu) must match bit for bit.
#include "fp8_jobs.hpp"
#include "ferry/kernels/cpu.hpp"
#include "ferry/kernels/fp8_block.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace ferry::kernels {
namespace {

using fp8::kBlock;
using fp8_detail::Fp8Job;

[[noreturn]] void refuse(std::size_t index, const ferry_plan_op_t& op, const std::string& rule) {
  fail(FERRY_STATUS_INVALID_ARGUMENT, "plan op {} (FP8_BLOCK_QUANT entry {} -> param {}): {}",
       index, op.src_tensor, op.dst_param, rule);
}

float load(std::uint32_t dtype, const unsigned char* p) {
  if (dtype == FERRY_DTYPE_BF16) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return bits::bf16_to_f32(v);
  }
  if (dtype == FERRY_DTYPE_F16) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return bits::f16_to_f32(v);
  }
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Tile (tr, tc) of one job: amax over the source tile, then quantize it (the second pass reads
// the same 128 x 128 elements, which are in cache by then).
void run_tile(const Fp8Job& job, std::uint64_t tr, std::uint64_t tc) {
  const std::uint64_t size = job.src_dtype == FERRY_DTYPE_F32 ? 4 : 2;
  const std::uint64_t r0 = tr * kBlock;
  const std::uint64_t c0 = tc * kBlock;
  const std::uint64_t nr = std::min(kBlock, job.rows - r0);
  const std::uint64_t nc = std::min(kBlock, job.cols - c0);
  float tile[kBlock * kBlock];
  float amax = 0.0f;
  for (std::uint64_t r = 0; r < nr; ++r) {
    const unsigned char* src = job.src + ((r0 + r) * job.src_stride + c0) * size;
    float* row = tile + r * kBlock;
    for (std::uint64_t c = 0; c < nc; ++c) {
      row[c] = load(job.src_dtype, src + c * size);
      amax = fp8::fold_amax(amax, row[c]);
    }
  }
  const float s = fp8::block_scale(amax, job.ue8m0 != 0);
  job.scales[tr * job.scale_stride + tc] = s;
  for (std::uint64_t r = 0; r < nr; ++r) {
    unsigned char* dst = job.dst + (r0 + r) * job.dst_stride + c0;
    const float* row = tile + r * kBlock;
    for (std::uint64_t c = 0; c < nc; ++c) dst[c] = fp8::quantize(row[c], s);
  }
}

}  // namespace

void check_fp8_plan(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                    std::span<const ParamView> params) {
  (void)fp8_jobs(ops, entries, params);
}

// Validates (check_plan, then the tile rules) and resolves every op into a job.
std::vector<Fp8Job> fp8_jobs(std::span<const ferry_plan_op_t> ops,
                             std::span<const EntryView> entries,
                             std::span<const ParamView> params) {
  check_plan(ops, entries, params);
  std::vector<Fp8Job> jobs;
  jobs.reserve(ops.size());
  std::uint64_t tiles = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const ferry_plan_op_t& op = ops[i];
    if (op.transform != FERRY_TRANSFORM_FP8_BLOCK_QUANT) {
      refuse(i, op, "only FP8_BLOCK_QUANT ops are executed here (copies and casts go to scatter)");
    }
    if (op.rows == 0 || op.cols == 0) continue;
    const ParamView& param = params[op.dst_param];
    const std::uint64_t k = op.dst_row_stride;
    if (k == 0 || param.elements % k != 0) {
      refuse(i, op, fmt::format("dst_row_stride {} must be the parameter's row length K and "
                                "divide its {} elements",
                                k, param.elements));
    }
    const std::uint64_t m = param.elements / k;
    const std::uint64_t row0 = op.dst_offset / k;
    const std::uint64_t col0 = op.dst_offset % k;
    if (row0 % kBlock != 0 || col0 % kBlock != 0) {
      refuse(i, op, fmt::format("the block starts at row {}, column {} of the [{}, {}] parameter "
                                "matrix, not on a 128 x 128 tile corner",
                                row0, col0, m, k));
    }
    if (op.rows % kBlock != 0 && row0 + op.rows != m) {
      refuse(i, op, fmt::format("{} rows from row {} end inside a 128-row tile of the {}-row "
                                "parameter matrix (only the last tile may be partial)",
                                op.rows, row0, m));
    }
    if (op.cols > k - col0 || (op.cols % kBlock != 0 && col0 + op.cols != k)) {
      refuse(i, op, fmt::format("{} columns from column {} end inside a 128-column tile of the "
                                "{}-column parameter matrix (only the last tile may be partial)",
                                op.cols, col0, k));
    }
    const ParamView& scale = params[op.scale_param];
    const std::uint64_t scale_stride = fp8::blocks_of(k);
    const auto needed = checked_mul(fp8::blocks_of(m), scale_stride);
    if (!needed || scale.elements < *needed) {
      refuse(i, op, fmt::format("scale parameter {} has {} elements, the [{}, {}] matrix needs "
                                "{} x {} scales",
                                op.scale_param, scale.elements, m, k, fp8::blocks_of(m),
                                scale_stride));
    }
    Fp8Job job{};
    job.src = reinterpret_cast<const unsigned char*>(entries[op.src_tensor].data) +
              op.src_offset * dtype_size(op.src_dtype);
    job.dst = reinterpret_cast<unsigned char*>(param.data) + op.dst_offset;
    job.scales = reinterpret_cast<float*>(scale.data) + (row0 / kBlock) * scale_stride +
                 col0 / kBlock;
    job.src_stride = op.src_row_stride;
    job.dst_stride = op.dst_row_stride;
    job.rows = op.rows;
    job.cols = op.cols;
    job.scale_stride = scale_stride;
    job.tile_cols = fp8::blocks_of(op.cols);
    job.first_tile = tiles;
    job.src_dtype = static_cast<std::uint32_t>(op.src_dtype);
    job.ue8m0 = (op.flags & FERRY_OP_SCALE_UE8M0) != 0 ? 1 : 0;
    tiles += fp8::blocks_of(op.rows) * job.tile_cols;  // bounded by the parameter's size
    jobs.push_back(job);
  }
  return jobs;
}

void fp8_block_quant_cpu(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                         std::span<const ParamView> params, unsigned threads) {
  const std::vector<Fp8Job> jobs = fp8_jobs(ops, entries, params);
  if (jobs.empty()) return;
  const std::uint64_t total =
      jobs.back().first_tile + fp8::blocks_of(jobs.back().rows) * jobs.back().tile_cols;
  if (threads == 0) threads = hardware_threads();
  // Work is handed out in runs of tiles (a tile is 16 Ki elements, ~10 us), one atomic per run.
  constexpr std::uint64_t kTilesPerRun = 8;
  std::atomic<std::uint64_t> next{0};
  auto work = [&] {
    std::size_t j = 0;
    for (std::uint64_t t0 = next.fetch_add(kTilesPerRun); t0 < total;
         t0 = next.fetch_add(kTilesPerRun)) {
      const std::uint64_t t1 = std::min(total, t0 + kTilesPerRun);
      for (std::uint64_t t = t0; t < t1; ++t) {
        // Tiles are handed out in increasing order, so the job index only moves forward
        // within one worker; restart from the run's job by binary search.
        if (t == t0) {
          auto it = std::upper_bound(jobs.begin(), jobs.end(), t,
                                     [](std::uint64_t v, const Fp8Job& jb) {
                                       return v < jb.first_tile;
                                     });
          j = static_cast<std::size_t>(it - jobs.begin()) - 1;
        }
        while (j + 1 < jobs.size() && jobs[j + 1].first_tile <= t) ++j;
        const Fp8Job& job = jobs[j];
        const std::uint64_t local = t - job.first_tile;
        run_tile(job, local / job.tile_cols, local % job.tile_cols);
      }
    }
  };
  const std::uint64_t runs = (total + kTilesPerRun - 1) / kTilesPerRun;
  const std::size_t workers = static_cast<std::size_t>(std::min<std::uint64_t>(threads, runs));
  std::vector<std::jthread> pool;
  pool.reserve(workers - 1);
  for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
}

}  // namespace ferry::kernels
