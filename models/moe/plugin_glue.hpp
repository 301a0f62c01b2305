// plugin_glue.hpp: the C-boundary pieces the MoE and low-bit model plugins share: reading
// ferry_tensor_desc_t / ferry_option_t arrays into C++ values (refusing malformed ones) and
// handing layouts and plans back as single heap blocks that layout_free / plan_free delete.
#pragma once

#include "dense_model.hpp"

#include <ferry/plugin.h>

#include <string>
#include <vector>

namespace ferry::model_glue {

// A layout and the storage its pointers refer to; freed as one.
struct LayoutBlock : ferry_layout_t {
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> descs;
};

// A plan and its operations; freed as one.
struct PlanBlock : ferry_plan_t {
  std::vector<ferry_plan_op_t> storage;
};

// Throws INVALID_ARGUMENT (prefixed with `who`) for a NULL array, a short struct_size, a NULL
// name or too many dims.
std::vector<dense::Tensor> read_descs(const char* who, const ferry_tensor_desc_t* descs,
                                      size_t count, const char* what);
// The options of create args (absent when struct_size does not reach them).
dense::Options read_options(const char* who, const ferry_model_create_args_t* args);
// config_json when struct_size reaches it, else NULL.
const char* read_config_json(const ferry_model_create_args_t* args);

ferry_layout_t* new_layout(const std::vector<dense::Tensor>& params);
ferry_plan_t* new_plan(std::vector<ferry_plan_op_t> ops);
void free_layout(ferry_layout_t* layout);
void free_plan(ferry_plan_t* plan);

}  // namespace ferry::model_glue
