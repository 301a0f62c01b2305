// tests/plugins/mock_model.cpp: libferry_model_mock.so, an identity model family for tests: the
// target layout is the checkpoint itself and each manifest entry is one COPY of the whole tensor
// into the parameter of the same name.
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

struct LayoutBlock {
  ferry_layout_t layout{};  // first member: layout_free casts back
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> params;
};

struct PlanBlock {
  ferry_plan_t plan{};  // first member: plan_free casts back
  std::vector<ferry_plan_op_t> ops;
};

}  // namespace

struct ferry_model {
  // Parameter index and description by name, from the last target_layout.
  std::map<std::string, std::pair<std::uint32_t, ferry_tensor_desc_t>> params;
  bool has_layout = false;
};

namespace {

std::span<const std::uint64_t> dims(const ferry_tensor_desc_t& t) {
  return {t.shape, std::min<std::size_t>(t.ndim, FERRY_MAX_DIMS)};
}

ferry_error_t* create(const ferry_model_create_args_t* args, ferry_model_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr)
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: create args or out is NULL");
    for (std::size_t i = 0; i < args->num_options; ++i) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: unknown option '{}' (it takes none)",
                  args->options[i].key ? args->options[i].key : "");
    }
    if (args->tp_size == 0 || args->tp_rank >= args->tp_size) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: tp_rank {} is not below tp_size {}",
                  args->tp_rank, args->tp_size);
    }
    const std::string layout = args->layout ? args->layout : "hf";
    if (layout != "hf") {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: layout '{}' unknown (only 'hf')",
                  layout);
    }
    *out = new ferry_model();
  });
}

void destroy(ferry_model_t* model) {
  delete model;
}

ferry_error_t* target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                             std::size_t num_checkpoint, ferry_layout_t** out) {
  return ferry::sdk::guard([&] {
    auto block = std::make_unique<LayoutBlock>();
    block->names.reserve(num_checkpoint);
    model->params.clear();
    for (std::size_t i = 0; i < num_checkpoint; ++i) {
      block->names.emplace_back(checkpoint[i].name ? checkpoint[i].name : "");
      if (!model->params
               .emplace(block->names.back(),
                        std::pair{static_cast<std::uint32_t>(i), checkpoint[i]})
               .second) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: tensor '{}' appears twice",
                    block->names.back());
      }
    }
    for (std::size_t i = 0; i < num_checkpoint; ++i) {
      ferry_tensor_desc_t param = checkpoint[i];
      param.name = block->names[i].c_str();
      block->params.push_back(param);
    }
    for (auto& [name, entry] : model->params) entry.second.name = nullptr;  // borrowed; not kept
    model->has_layout = true;
    block->layout.struct_size = FERRY_STRUCT_SIZE(ferry_layout_t, num_params);
    block->layout.params = block->params.data();
    block->layout.num_params = block->params.size();
    *out = &block.release()->layout;
  });
}

void layout_free(ferry_model_t* /*model*/, ferry_layout_t* layout) {
  delete reinterpret_cast<LayoutBlock*>(layout);
}

// One COPY op of the whole of `entry` (index `src`) into its parameter.
ferry_plan_op_t copy_op(const ferry_model_t& model, const ferry_tensor_desc_t& entry,
                        std::uint32_t src) {
  const std::string name = entry.name ? entry.name : "";
  const auto found = model.params.find(name);
  if (found == model.params.end()) {
    ferry::fail(FERRY_STATUS_NOT_FOUND, "mock model: tensor '{}' is not in the target layout",
                name);
  }
  const auto& [index, param] = found->second;
  if (param.dtype != entry.dtype || param.ndim != entry.ndim ||
      !std::equal(dims(param).begin(), dims(param).end(), dims(entry).begin())) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                "mock model: tensor '{}' is {} {}, the parameter {} {}", name,
                ferry::dtype_name(entry.dtype), ferry::shape_string(dims(entry)),
                ferry::dtype_name(param.dtype), ferry::shape_string(dims(param)));
  }
  const auto count = ferry::element_count(dims(entry));
  if (!count)
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "mock model: tensor '{}' element count overflows",
                name);
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src;
  op.src_dtype = entry.dtype;
  op.src_row_stride = *count;
  op.dst_param = index;
  op.dst_dtype = param.dtype;
  op.dst_row_stride = *count;
  op.rows = 1;
  op.cols = *count;
  op.transform = FERRY_TRANSFORM_COPY;
  return op;
}

ferry_plan_t* finish(std::unique_ptr<PlanBlock> block) {
  block->plan.struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  block->plan.ops = block->ops.data();
  block->plan.num_ops = block->ops.size();
  return &block.release()->plan;
}

ferry_error_t* plan(ferry_model_t* model, const ferry_tensor_desc_t* entries,
                    std::size_t num_entries, ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (!model->has_layout)
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION, "mock model: plan before target_layout");
    auto block = std::make_unique<PlanBlock>();
    for (std::size_t i = 0; i < num_entries; ++i) {
      block->ops.push_back(copy_op(*model, entries[i], static_cast<std::uint32_t>(i)));
    }
    *out = finish(std::move(block));
  });
}

void plan_free(ferry_model_t* /*model*/, ferry_plan_t* plan) {
  delete reinterpret_cast<PlanBlock*>(plan);
}

ferry_error_t* locate(ferry_model_t* model, const ferry_tensor_desc_t* tensor, ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (!model->has_layout)
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION, "mock model: locate before target_layout");
    auto block = std::make_unique<PlanBlock>();
    block->ops.push_back(copy_op(*model, *tensor, 0));
    *out = finish(std::move(block));
  });
}

const ferry_model_api_t kMockModelApi = {
    FERRY_STRUCT_SIZE(ferry_model_api_t, locate),
    create,
    destroy,
    target_layout,
    layout_free,
    plan,
    plan_free,
    locate,
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* n) {
  return ferry::sdk::negotiate(n, FERRY_PLUGIN_MODEL, "mock", "0.1-test", &kMockModelApi);
}
