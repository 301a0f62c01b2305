// The dense model plugin's C entry: ferry_plugin_negotiate and the ferry_model_api_t table, a
// thin boundary that validates C structs and forwards to ferry::dense::DenseModel.
#include "dense_model.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <memory>
#include <string>
#include <vector>

// The opaque instance handed to the host.
struct ferry_model {
  explicit ferry_model(ferry::dense::ModelConfig config) : model(std::move(config)) {}
  ferry::dense::DenseModel model;
};

namespace {

// A layout and the storage its pointers refer to; freed as one by layout_free.
struct LayoutBlock : ferry_layout_t {
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> descs;
};

// A plan and its operations; freed as one by plan_free.
struct PlanBlock : ferry_plan_t {
  std::vector<ferry_plan_op_t> storage;
};

constexpr const char* kName = "dense";

// Copies C tensor descriptions into C++ values, refusing malformed ones.
std::vector<ferry::dense::Tensor> read_descs(const ferry_tensor_desc_t* descs, size_t count,
                                             const char* what) {
  if (count > 0 && descs == nullptr) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: {} is NULL with {} tensors", what,
                count);
  }
  std::vector<ferry::dense::Tensor> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ferry_tensor_desc_t& d = descs[i];
    if (d.struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape)) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "dense model: {} tensor {} has struct_size {}, needs at least {}", what, i,
                  d.struct_size, FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape));
    }
    if (d.name == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: {} tensor {} has no name", what, i);
    }
    if (d.ndim > FERRY_MAX_DIMS) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: {} tensor '{}' has {} dims (max {})",
                  what, d.name, d.ndim, FERRY_MAX_DIMS);
    }
    out.push_back(ferry::dense::Tensor{d.name, d.dtype,
                                       std::vector<uint64_t>(d.shape, d.shape + d.ndim)});
  }
  return out;
}

ferry_plan_t* new_plan(std::vector<ferry_plan_op_t> ops) {
  auto block = std::make_unique<PlanBlock>();
  block->storage = std::move(ops);
  block->struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  block->ops = block->storage.data();
  block->num_ops = block->storage.size();
  return block.release();
}

ferry_error_t* model_create(const ferry_model_create_args_t* args, ferry_model_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: create needs args and out");
    }
    *out = nullptr;
    if (args->struct_size < FERRY_STRUCT_SIZE(ferry_model_create_args_t, tp_size)) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "dense model: create args struct_size {} is too short (needs tp_size)",
                  args->struct_size);
    }
    const bool has_config =
        args->struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, config_json);
    const bool has_options =
        args->struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    ferry::dense::Options options;
    if (has_options && args->num_options > 0) {
      if (args->options == nullptr) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: options is NULL with {} options",
                    args->num_options);
      }
      for (size_t i = 0; i < args->num_options; ++i) {
        const ferry_option_t& o = args->options[i];
        if (o.key == nullptr || o.value == nullptr) {
          ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: option {} has a NULL key or value",
                      i);
        }
        options.emplace_back(o.key, o.value);
      }
    }
    ferry::dense::ModelConfig config =
        ferry::dense::make_config(args->layout, args->tp_rank, args->tp_size, options,
                                  has_config ? args->config_json : nullptr);
    *out = new ferry_model(std::move(config));
  });
}

void model_destroy(ferry_model_t* model) { delete model; }

ferry_error_t* model_target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                   size_t num_checkpoint, ferry_layout_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: target_layout needs model and out");
    }
    *out = nullptr;
    std::vector<ferry::dense::Tensor> params =
        model->model.target_layout(read_descs(checkpoint, num_checkpoint, "checkpoint catalog"));
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
    *out = block.release();
  });
}

void model_layout_free(ferry_model_t* /*model*/, ferry_layout_t* layout) {
  delete static_cast<LayoutBlock*>(layout);
}

ferry_error_t* model_plan(ferry_model_t* model, const ferry_tensor_desc_t* entries,
                          size_t num_entries, ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: plan needs model and out");
    }
    *out = nullptr;
    *out = new_plan(model->model.plan(read_descs(entries, num_entries, "manifest entries")));
  });
}

void model_plan_free(ferry_model_t* /*model*/, ferry_plan_t* plan) {
  delete static_cast<PlanBlock*>(plan);
}

ferry_error_t* model_locate(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint_tensor,
                            ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || checkpoint_tensor == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "dense model: locate needs model, checkpoint_tensor and out");
    }
    *out = nullptr;
    std::vector<ferry::dense::Tensor> tensor = read_descs(checkpoint_tensor, 1, "locate");
    *out = new_plan({model->model.locate(tensor[0])});
  });
}

const ferry_model_api_t kModelApi = {
    FERRY_STRUCT_SIZE(ferry_model_api_t, locate),
    model_create,
    model_destroy,
    model_target_layout,
    model_layout_free,
    model_plan,
    model_plan_free,
    model_locate,
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_MODEL, kName, FERRY_DENSE_VERSION,
                               &kModelApi);
}
