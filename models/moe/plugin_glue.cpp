// The C-boundary pieces shared by the MoE and low-bit model plugins (see plugin_glue.hpp).
#include "plugin_glue.hpp"

#include <ferry/sdk/error.hpp>

#include <memory>

namespace ferry::model_glue {

std::vector<dense::Tensor> read_descs(const char* who, const ferry_tensor_desc_t* descs,
                                      size_t count, const char* what) {
  if (count > 0 && descs == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} is NULL with {} tensors", who, what, count);
  }
  std::vector<dense::Tensor> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ferry_tensor_desc_t& d = descs[i];
    if (d.struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor {} has struct_size {}, needs at least {}",
           who, what, i, d.struct_size, FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape));
    }
    if (d.name == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor {} has no name", who, what, i);
    if (d.ndim > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor '{}' has {} dims (max {})", who, what,
           d.name, d.ndim, FERRY_MAX_DIMS);
    }
    out.push_back(dense::Tensor{d.name, d.dtype, std::vector<uint64_t>(d.shape, d.shape + d.ndim)});
  }
  return out;
}

dense::Options read_options(const char* who, const ferry_model_create_args_t* args) {
  dense::Options options;
  if (args->struct_size < FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options) ||
      args->num_options == 0) {
    return options;
  }
  if (args->options == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: options is NULL with {} options", who,
         args->num_options);
  }
  for (size_t i = 0; i < args->num_options; ++i) {
    const ferry_option_t& o = args->options[i];
    if (o.key == nullptr || o.value == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: option {} has a NULL key or value", who, i);
    }
    options.emplace_back(o.key, o.value);
  }
  return options;
}

const char* read_config_json(const ferry_model_create_args_t* args) {
  return args->struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, config_json)
             ? args->config_json
             : nullptr;
}

ferry_layout_t* new_layout(const std::vector<dense::Tensor>& params) {
  auto block = std::make_unique<LayoutBlock>();
  block->names.reserve(params.size());
  for (const auto& p : params) block->names.push_back(p.name);
  block->descs.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ferry_tensor_desc_t& d = block->descs[i];
    d = ferry_tensor_desc_t{};
    d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
    d.name = block->names[i].c_str();
    d.dtype = params[i].dtype;
    d.ndim = static_cast<uint32_t>(params[i].shape.size());
    for (size_t k = 0; k < params[i].shape.size(); ++k) d.shape[k] = params[i].shape[k];
  }
  block->struct_size = FERRY_STRUCT_SIZE(ferry_layout_t, num_params);
  block->params = block->descs.data();
  block->num_params = block->descs.size();
  return block.release();
}

ferry_plan_t* new_plan(std::vector<ferry_plan_op_t> ops) {
  auto block = std::make_unique<PlanBlock>();
  block->storage = std::move(ops);
  block->struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  block->ops = block->storage.data();
  block->num_ops = block->storage.size();
  return block.release();
}

void free_layout(ferry_layout_t* layout) { delete static_cast<LayoutBlock*>(layout); }
void free_plan(ferry_plan_t* plan) { delete static_cast<PlanBlock*>(plan); }

}  // namespace ferry::model_glue
