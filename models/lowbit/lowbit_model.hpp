// lowbit_model.hpp: the low-bit model plugin's logic: wraps the MoE model (which itself hands
// dense families to the dense model) and turns every linear weight parameter into FP8 e4m3 with
// 128x128 block scales (`<name>_scale_inv`, float32), planning FERRY_TRANSFORM_FP8_BLOCK_QUANT
// ops that follow the scale-addressing convention of ferry/kernels/cpu.hpp. Pure logic.
#pragma once

#include "moe_model.hpp"

#include <ferry/plugin.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::lowbit {

using dense::Options;
using dense::Tensor;

struct LowbitConfig {
  moe::MoeConfig inner;
  bool ue8m0 = false;  // option scale_fmt = "ue8m0": power-of-two scales
  // Parameters whose name contains one of these stay in their (possibly cast) dtype.
  std::vector<std::string> unquantized;
};

// The default of option `unquantized`: norms, biases, embeddings, lm_head and the MoE routers.
const std::vector<std::string>& default_unquantized();

// Options: scale_fmt ("float32" default, or "ue8m0"), unquantized (comma-separated name
// substrings; replaces the default; "" quantizes every eligible weight), and dtype (passed to
// the inner model: the dtype of what stays unquantized). Throws INVALID_ARGUMENT naming the
// bad option.
LowbitConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                         std::uint32_t ep_rank, std::uint32_t ep_size, const Options& options,
                         const char* config_json);

// Threading as MoeModel.
class LowbitModel {
 public:
  explicit LowbitModel(LowbitConfig config);
  ~LowbitModel();

  // The inner layout with every quantized weight turned F8_E4M3 and followed by its float32
  // scale parameter: "<x>.weight" -> "<x>.weight_scale_inv" [ceil(N/128), ceil(K/128)], stacked
  // "w13_weight" -> "w13_weight_scale_inv" [E, ceil(N/128), ceil(K/128)]. A weight is quantized
  // when it is 2-D (or 3-D stacked experts), of a float dtype, and its name contains none of the
  // `unquantized` substrings. Throws INVALID_ARGUMENT naming the tensor when a tensor-parallel
  // shard (or a part of a fused or stacked parameter) does not start and end on 128 rows/columns,
  // besides the inner model's errors.
  std::vector<Tensor> target_layout(const std::vector<Tensor>& catalog);

  // The inner plan with ops into quantized weights rewritten as FP8_BLOCK_QUANT (whole matrix
  // rows, dst_row_stride = K, scale_param = the weight's scale parameter).
  std::vector<ferry_plan_op_t> plan(const std::vector<Tensor>& entries) const;

  // The inner locate; for a quantized weight the op reads the F8_E4M3 values.
  ferry_plan_op_t locate(const Tensor& tensor) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping(const char* caller) const;
  ferry_plan_op_t rewrite(const Mapping& m, ferry_plan_op_t op, const std::string& what) const;

  LowbitConfig config_;
  moe::MoeModel inner_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Mapping> mapping_;
};

}  // namespace ferry::lowbit
