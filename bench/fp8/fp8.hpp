// bench/fp8/fp8.hpp: `ferry bench fp8`: FP8 e4m3 128x128 block quantization of a few GiB of bf16
// weight matrices in one call (fp8_block_quant_cuda / _cpu) against the memory roofline (a flat
// D2D copy's read+write bandwidth) and the obvious PyTorch code (bench/torch_baselines.py,
// case fp8). The CPU and CUDA measurements live in their own files.
#pragma once

#include <ferry/kernels/cpu.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/report.hpp"

namespace ferry::bench {

// `count` bf16 matrices of [rows, cols] back to back in one bucket, each quantized into its own
// F8_E4M3 parameter with its float32 scale parameter (params 2i and 2i + 1): one FP8 op each.
struct Fp8Layout {
  std::uint64_t count = 0, rows = 0, cols = 0;
  std::vector<ferry_plan_op_t> ops;
  std::uint64_t elements() const noexcept { return rows * cols; }  // per matrix
  std::uint64_t scales() const noexcept { return ((rows + 127) / 128) * ((cols + 127) / 128); }
};
Fp8Layout make_fp8_layout(std::uint64_t count, std::uint64_t rows, std::uint64_t cols);
std::vector<kernels::EntryView> fp8_entries(const Fp8Layout& l, const std::byte* bucket);
std::vector<kernels::ParamView> fp8_params(const Fp8Layout& l, std::byte* q, std::byte* scales);

// `bytes` of realistic bf16 weights (normal values, a few per mille outliers), deterministic.
std::vector<std::uint16_t> fp8_source_pattern(std::uint64_t elements, std::uint64_t seed);

struct Fp8Measurement {
  std::uint64_t count = 0;
  std::string note;
  std::vector<double> ferry_s;  // one call quantizing every matrix
  std::vector<double> copy_s;   // one flat copy of the bf16 bucket (the roofline reference)
  bool verified = false;
  std::string verification;
};

Fp8Measurement measure_fp8_cpu(const Fp8Layout& layout, int warmup, int repeat);
// Scales the count down (with a note) when the GPU lacks memory. Built with cuda only.
Fp8Measurement measure_fp8_cuda(Fp8Layout layout, int warmup, int repeat);

int run_fp8_bench(const BenchOptions& options, Json& records);

}  // namespace ferry::bench
