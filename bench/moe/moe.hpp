// bench/moe/moe.hpp: `ferry bench moe`: one MoE update with the shapes of Qwen3-30B-A3B (128
// experts per layer, hidden 2048, moe_intermediate 768; as many of the 48 layers as fit): one
// bucket per layer (its 384 expert tensors) planned by the real MoE model plugin into the stacked
// w13/w2 parameters and applied with one scatter launch per bucket, against a per-tensor copy_
// loop and torch._foreach_copy_ (bench/torch_baselines.py, case moe).
#pragma once

#include <ferry/kernels/cpu.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/case.hpp"
#include "bench/common/report.hpp"

namespace ferry::bench {

struct MoeShape {
  std::uint64_t layers = 48, experts = 128, hidden = 2048, inter = 768, vocab = 151936;
  std::uint64_t tensor_elements() const noexcept { return hidden * inter; }
  std::uint64_t bucket_bytes() const noexcept { return experts * 3 * tensor_elements() * 2; }
};

// The plans of every layer's bucket from the MoE plugin, and where the stacked parameters are
// in its layout.
struct MoePlans {
  std::vector<std::vector<ferry_plan_op_t>> ops;  // per layer
  std::vector<std::uint32_t> w13, w2;             // per layer: layout indices
  std::size_t layout_size = 0;
};
MoePlans make_moe_plans(const MoeShape& shape, const GlobalOptions& globals);

// Entry views of one layer's bucket at `bucket` (expert e: gate, up, down, back to back).
std::vector<kernels::EntryView> moe_entries(const MoeShape& shape, const std::byte* bucket);

struct MoeMeasurement {
  std::uint64_t layers = 0;
  std::string note;
  std::vector<double> ferry_s;  // every layer's bucket applied (all layers, one launch each)
  bool verified = false;
  std::string verification;
};

MoeMeasurement measure_moe_cpu(const MoeShape& shape, const MoePlans& plans, int warmup,
                               int repeat);
// Built with cuda only; scales the layer count down (with a note) to what fits.
MoeMeasurement measure_moe_cuda(const MoeShape& shape, const MoePlans& plans, int warmup,
                                int repeat);

int run_moe_bench(const BenchOptions& options, const GlobalOptions& globals, Json& records);

}  // namespace ferry::bench
