// The low-bit model's layout and plan rewriting (see lowbit_model.hpp).
#include "lowbit_model.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <limits>
#include <string_view>

namespace ferry::lowbit {
namespace {

constexpr std::uint64_t kBlock = 128;
constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

std::uint64_t blocks(std::uint64_t n) { return n / kBlock + (n % kBlock != 0 ? 1 : 0); }

bool float_dtype(ferry_dtype_t d) {
  return d == FERRY_DTYPE_BF16 || d == FERRY_DTYPE_F16 || d == FERRY_DTYPE_F32;
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

struct LowbitModel::Mapping {
  std::vector<Tensor> params;
  std::vector<std::uint32_t> outer_of;  // inner parameter -> outer parameter
  std::vector<std::uint32_t> scale_of;  // inner parameter -> its scale parameter, or kNone
  std::vector<std::uint64_t> matrix_rows;  // inner parameter -> M of its [M, K] view
  std::vector<std::uint64_t> matrix_cols;  // inner parameter -> K
};

const std::vector<std::string>& default_unquantized() {
  static const std::vector<std::string> names = {
      "norm",                 // every *layernorm / *_norm weight
      "bias",                 // q/k/v biases, e_score_correction_bias
      "embed_tokens",         // embeddings
      "lm_head",              //
      "mlp.gate.weight",      // the MoE router
      "shared_expert_gate.",  // Qwen2-MoE's shared-expert gate (a router too)
  };
  return names;
}

LowbitConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                         std::uint32_t ep_rank, std::uint32_t ep_size, const Options& options,
                         const char* config_json) {
  LowbitConfig config;
  config.unquantized = default_unquantized();
  Options inner;
  bool have_fmt = false, have_list = false;
  for (const auto& [key, value] : options) {
    if (key == "scale_fmt") {
      if (have_fmt) fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: option 'scale_fmt' given twice");
      have_fmt = true;
      if (value == "ue8m0") {
        config.ue8m0 = true;
      } else if (value != "float32" && value != "fp32") {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "lowbit model: option 'scale_fmt' = '{}' is not one of float32, ue8m0", value);
      }
    } else if (key == "unquantized") {
      if (have_list) fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: option 'unquantized' given twice");
      have_list = true;
      config.unquantized = split_list(value);
    } else if (key == "dtype") {
      inner.emplace_back(key, value);
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "lowbit model: unknown option '{}' (known options: scale_fmt, unquantized, dtype)", key);
    }
  }
  config.inner = moe::make_config(layout, tp_rank, tp_size, ep_rank, ep_size, inner, config_json);
  return config;
}

LowbitModel::LowbitModel(LowbitConfig config) : config_(std::move(config)), inner_(config_.inner) {}
LowbitModel::~LowbitModel() = default;

std::vector<Tensor> LowbitModel::target_layout(const std::vector<Tensor>& catalog) {
  const std::vector<Tensor> inner = inner_.target_layout(catalog);
  auto m = std::make_shared<Mapping>();
  m->outer_of.resize(inner.size());
  m->scale_of.assign(inner.size(), kNone);
  m->matrix_rows.assign(inner.size(), 0);
  m->matrix_cols.assign(inner.size(), 0);
  std::vector<std::string> bad;
  for (std::size_t i = 0; i < inner.size(); ++i) {
    const Tensor& p = inner[i];
    bool quantize = float_dtype(p.dtype) && (p.shape.size() == 2 || p.shape.size() == 3);
    const bool stacked = p.shape.size() == 3;
    const std::string_view name = p.name;
    std::string scale_name;
    if (name.ends_with(".weight") || (stacked && name.ends_with("_weight"))) {
      scale_name = p.name + "_scale_inv";
    } else {
      quantize = false;
    }
    for (const std::string& pattern : config_.unquantized) {
      if (quantize && name.find(pattern) != std::string_view::npos) quantize = false;
    }
    m->outer_of[i] = static_cast<std::uint32_t>(m->params.size());
    if (!quantize) {
      m->params.push_back(p);
      continue;
    }
    const std::uint64_t n = p.shape[p.shape.size() - 2];
    const std::uint64_t k = p.shape.back();
    if (stacked && n % kBlock != 0) {
      bad.push_back(fmt::format("{} (stacked: {} rows per expert, not a multiple of 128)", p.name, n));
    }
    m->params.push_back(Tensor{p.name, FERRY_DTYPE_F8_E4M3, p.shape});
    m->scale_of[i] = static_cast<std::uint32_t>(m->params.size());
    m->matrix_rows[i] = stacked ? p.shape[0] * n : n;
    m->matrix_cols[i] = k;
    std::vector<std::uint64_t> scale_shape = {blocks(n), blocks(k)};
    if (stacked) scale_shape.insert(scale_shape.begin(), p.shape[0]);
    m->params.push_back(Tensor{scale_name, FERRY_DTYPE_F32, scale_shape});
  }
  if (!bad.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: cannot quantize in 128x128 blocks: {}",
         fmt::join(bad, ", "));
  }
  // Every checkpoint tensor's block of a quantized parameter must be whole 128x128 tiles.
  const std::uint32_t tp = config_.inner.dense.tp_size;
  for (const Tensor& t : catalog) {
    ferry_plan_op_t op;
    try {
      op = inner_.locate(Tensor{t.name, t.dtype, {}});
    } catch (const Error& e) {
      if (e.code() == FERRY_STATUS_NOT_FOUND) continue;  // no region on this rank
      throw;
    }
    if (m->scale_of[op.dst_param] == kNone || op.rows == 0 || op.cols == 0) continue;
    const std::uint64_t k = m->matrix_cols[op.dst_param];
    const std::uint64_t src_rows = t.shape.empty() ? 1 : t.shape[0];
    const std::uint64_t src_cols = t.shape.size() > 1 ? t.shape[1] : 1;
    if (tp > 1 && op.rows == 1 && src_cols != 0 && op.cols / src_cols < src_rows &&
        (op.cols / src_cols) % kBlock != 0) {
      bad.push_back(fmt::format("{} (tensor-parallel shard of {} rows is not a multiple of 128)",
                                t.name, op.cols / src_cols));
      continue;
    }
    if (tp > 1 && op.rows > 1 && op.cols < src_cols && op.cols % kBlock != 0) {
      bad.push_back(fmt::format("{} (tensor-parallel shard of {} columns is not a multiple of 128)",
                                t.name, op.cols));
      continue;
    }
    (void)k;
    std::string why;
    try {
      (void)rewrite(*m, op, t.name);
    } catch (const Error& e) {
      bad.push_back(e.what());
    }
  }
  if (!bad.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "lowbit model: {} tensor(s) do not fall on 128x128 block boundaries: {}", bad.size(),
         fmt::join(bad, "; "));
  }
  std::vector<Tensor> params = m->params;
  {
    std::lock_guard lock(mutex_);
    mapping_ = std::move(m);
  }
  return params;
}

std::shared_ptr<const LowbitModel::Mapping> LowbitModel::mapping(const char* caller) const {
  std::lock_guard lock(mutex_);
  if (!mapping_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "lowbit model: {} called before target_layout", caller);
  }
  return mapping_;
}

ferry_plan_op_t LowbitModel::rewrite(const Mapping& m, ferry_plan_op_t op,
                                     const std::string& what) const {
  const std::uint32_t inner = op.dst_param;
  op.dst_param = m.outer_of[inner];
  const std::uint32_t scale = m.scale_of[inner];
  if (scale == kNone || op.rows == 0 || op.cols == 0) return op;
  const std::uint64_t k = m.matrix_cols[inner];
  const std::uint64_t rows_total = m.matrix_rows[inner];
  if (op.rows == 1 || (op.dst_row_stride == op.cols && op.src_row_stride == op.cols)) {
    // A contiguous run: whole matrix rows of K elements.
    const std::uint64_t n = op.rows * op.cols;
    if (n % k != 0 || op.dst_offset % k != 0) {
      fail(FERRY_STATUS_INTERNAL, "lowbit model: {} is not whole rows of its parameter", what);
    }
    op.rows = n / k;
    op.cols = k;
    op.src_row_stride = k;
    op.dst_row_stride = k;
  } else if (op.dst_row_stride != k) {
    fail(FERRY_STATUS_INTERNAL, "lowbit model: {} has row stride {}, its parameter {} columns",
         what, op.dst_row_stride, k);
  }
  const std::uint64_t row0 = op.dst_offset / k;
  const std::uint64_t col0 = op.dst_offset % k;
  const bool rows_ok = row0 % kBlock == 0 && (op.rows % kBlock == 0 || row0 + op.rows == rows_total);
  const bool cols_ok = col0 % kBlock == 0 && (op.cols % kBlock == 0 || col0 + op.cols == k);
  if (!rows_ok || !cols_ok) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{} (rows [{}, {}) x columns [{}, {}) of the [{}, {}] parameter {} are not whole 128x128 "
         "blocks: a fused or stacked part must start and end on a multiple of 128)",
         what, row0, row0 + op.rows, col0, col0 + op.cols, rows_total, k,
         m.params[op.dst_param].name);
  }
  op.transform = FERRY_TRANSFORM_FP8_BLOCK_QUANT;
  op.dst_dtype = FERRY_DTYPE_F8_E4M3;
  op.scale_param = scale;
  op.flags = config_.ue8m0 ? static_cast<std::uint32_t>(FERRY_OP_SCALE_UE8M0) : 0u;
  return op;
}

std::vector<ferry_plan_op_t> LowbitModel::plan(const std::vector<Tensor>& entries) const {
  const std::shared_ptr<const Mapping> m = mapping("plan");
  std::vector<ferry_plan_op_t> ops = inner_.plan(entries);
  for (ferry_plan_op_t& op : ops) {
    const bool quantized = m->scale_of[op.dst_param] != kNone;
    if (quantized && !float_dtype(op.src_dtype)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "lowbit model: manifest entry '{}' is {}; FP8 quantization reads BF16, F16 or F32",
           entries[op.src_tensor].name, dtype_name(op.src_dtype));
    }
    op = rewrite(*m, op, entries[op.src_tensor].name);
  }
  return ops;
}

ferry_plan_op_t LowbitModel::locate(const Tensor& tensor) const {
  const std::shared_ptr<const Mapping> m = mapping("locate");
  return rewrite(*m, inner_.locate(tensor), tensor.name);
}

}  // namespace ferry::lowbit
