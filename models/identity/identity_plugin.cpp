// models/identity: the identity model-family plugin: the target layout is the checkpoint itself
// (same names, dtypes, shapes) and every plan is one plain copy per tensor. For embedded receivers
// whose parameters carry the sender's names (a state_dict pushed into named_parameters()).
#include <ferry/plugin.h>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr const char* kName = "identity";

struct Param {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

// The catalog fixed by the last target_layout: parameters in catalog order and their indices.
struct Catalog {
  std::vector<Param> params;
  std::unordered_map<std::string, std::uint32_t> index;
};

// A layout and the storage its pointers refer to; freed as one by layout_free.
struct LayoutBlock : ferry_layout_t {
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> descs;
};

// A plan and its operations; freed as one by plan_free.
struct PlanBlock : ferry_plan_t {
  std::vector<ferry_plan_op_t> storage;
};

Param read_desc(const ferry_tensor_desc_t* descs, size_t i, const char* what) {
  const ferry_tensor_desc_t& d = descs[i];
  if (d.struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape)) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                "identity model: {} tensor {} has struct_size {}, needs at least {}", what, i,
                d.struct_size, FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape));
  }
  if (d.name == nullptr || d.name[0] == '\0') {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor {} has no name", what, i);
  }
  if (d.ndim > FERRY_MAX_DIMS) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor '{}' has {} dims (max {})",
                what, d.name, d.ndim, FERRY_MAX_DIMS);
  }
  Param p{d.name, d.dtype, std::vector<std::uint64_t>(d.shape, d.shape + d.ndim)};
  if (ferry::dtype_size(p.dtype) == 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor '{}' has dtype value {}",
                what, p.name, static_cast<int>(p.dtype));
  }
  if (!ferry::byte_size(p.dtype, p.shape)) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor '{}' shape {} overflows",
                what, p.name, ferry::shape_string(p.shape));
  }
  return p;
}

std::vector<Param> read_descs(const ferry_tensor_desc_t* descs, size_t count, const char* what) {
  if (count > 0 && descs == nullptr) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} is NULL with {} tensors", what,
                count);
  }
  std::vector<Param> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(read_desc(descs, i, what));
  return out;
}

// One copy of the whole tensor: a single row of every element, dtype unchanged.
ferry_plan_op_t whole_copy(std::uint32_t src_tensor, std::uint32_t dst_param, const Param& p) {
  const std::uint64_t elements = *ferry::element_count(p.shape);
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src_tensor;
  op.src_dtype = p.dtype;
  op.src_offset = 0;
  op.src_row_stride = elements;
  op.dst_param = dst_param;
  op.dst_dtype = p.dtype;
  op.dst_offset = 0;
  op.dst_row_stride = elements;
  op.rows = 1;
  op.cols = elements;
  op.transform = FERRY_TRANSFORM_COPY;
  return op;
}

ferry_plan_t* new_plan(std::vector<ferry_plan_op_t> ops) {
  auto block = std::make_unique<PlanBlock>();
  block->storage = std::move(ops);
  block->struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  block->ops = block->storage.data();
  block->num_ops = block->storage.size();
  return block.release();
}

}  // namespace

// The opaque instance: the catalog of the last target_layout, swapped whole under the mutex so
// plan/locate (any thread) always see a complete one.
struct ferry_model {
  std::mutex mutex;
  std::shared_ptr<const Catalog> catalog;

  std::shared_ptr<const Catalog> current(const char* call) {
    const std::lock_guard lock(mutex);
    if (!catalog) {
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION,
                  "identity model: {} before target_layout (the layout is not known yet)", call);
    }
    return catalog;
  }

  // The catalog index of `entry`, refusing a name, dtype or shape the catalog does not have.
  std::uint32_t find(const Catalog& c, const Param& entry) const {
    const auto it = c.index.find(entry.name);
    if (it == c.index.end()) {
      ferry::fail(FERRY_STATUS_NOT_FOUND,
                  "identity model: tensor '{}' is not a parameter of this receiver", entry.name);
    }
    const Param& p = c.params[it->second];
    if (p.dtype != entry.dtype || p.shape != entry.shape) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: tensor '{}' is {} {}, the parameter is {} {} (the identity "
                  "model copies without casting or reshaping)",
                  entry.name, ferry::dtype_name(entry.dtype), ferry::shape_string(entry.shape),
                  ferry::dtype_name(p.dtype), ferry::shape_string(p.shape));
    }
    return it->second;
  }
};

namespace {

ferry_error_t* model_create(const ferry_model_create_args_t* args, ferry_model_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: create needs args and out");
    }
    *out = nullptr;
    if (args->struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, tp_size) &&
        args->tp_size > 1) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: tp_size {} is not supported (the identity layout is unsharded)",
                  args->tp_size);
    }
    if (args->struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options) &&
        args->num_options > 0) {
      const char* key = args->options != nullptr && args->options[0].key != nullptr
                            ? args->options[0].key
                            : "?";
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: unknown option '{}' (the identity model takes no options)", key);
    }
    *out = new ferry_model();
  });
}

void model_destroy(ferry_model_t* model) { delete model; }

ferry_error_t* model_target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                   size_t num_checkpoint, ferry_layout_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: target_layout needs model and out");
    }
    *out = nullptr;
    auto catalog = std::make_shared<Catalog>();
    catalog->params = read_descs(checkpoint, num_checkpoint, "checkpoint catalog");
    for (std::uint32_t i = 0; i < catalog->params.size(); ++i) {
      if (!catalog->index.emplace(catalog->params[i].name, i).second) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "identity model: checkpoint tensor '{}' appears twice in the catalog",
                    catalog->params[i].name);
      }
    }
    auto block = std::make_unique<LayoutBlock>();
    for (const auto& p : catalog->params) block->names.push_back(p.name);
    block->descs.resize(catalog->params.size());
    for (size_t i = 0; i < catalog->params.size(); ++i) {
      const Param& p = catalog->params[i];
      ferry_tensor_desc_t& d = block->descs[i];
      d = ferry_tensor_desc_t{};
      d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
      d.name = block->names[i].c_str();
      d.dtype = p.dtype;
      d.ndim = static_cast<uint32_t>(p.shape.size());
      for (size_t k = 0; k < p.shape.size(); ++k) d.shape[k] = p.shape[k];
    }
    block->struct_size = FERRY_STRUCT_SIZE(ferry_layout_t, num_params);
    block->params = block->descs.data();
    block->num_params = block->descs.size();
    {
      const std::lock_guard lock(model->mutex);
      model->catalog = std::move(catalog);
    }
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
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: plan needs model and out");
    }
    *out = nullptr;
    const auto catalog = model->current("plan");
    const std::vector<Param> list = read_descs(entries, num_entries, "manifest entries");
    std::vector<ferry_plan_op_t> ops;
    ops.reserve(list.size());
    std::vector<bool> seen(catalog->params.size(), false);
    for (std::uint32_t i = 0; i < list.size(); ++i) {
      const std::uint32_t param = model->find(*catalog, list[i]);
      if (seen[param]) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "identity model: tensor '{}' appears twice in one bucket", list[i].name);
      }
      seen[param] = true;
      // A tensor without elements has nothing to copy.
      if (*ferry::element_count(list[i].shape) > 0) ops.push_back(whole_copy(i, param, list[i]));
    }
    *out = new_plan(std::move(ops));
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
                  "identity model: locate needs model, checkpoint_tensor and out");
    }
    *out = nullptr;
    const auto catalog = model->current("locate");
    if (checkpoint_tensor->struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape) ||
        checkpoint_tensor->name == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: locate needs a named tensor");
    }
    const auto it = catalog->index.find(checkpoint_tensor->name);
    if (it == catalog->index.end()) {
      ferry::fail(FERRY_STATUS_NOT_FOUND, "identity model: no parameter named '{}'",
                  checkpoint_tensor->name);
    }
    const Param& p = catalog->params[it->second];
    // An empty shape means "by name only"; otherwise it must be the parameter's.
    if (checkpoint_tensor->ndim > 0) {
      model->find(*catalog, read_desc(checkpoint_tensor, 0, "locate"));
    }
    *out = new_plan({whole_copy(0, it->second, p)});
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
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_MODEL, kName, FERRY_IDENTITY_VERSION,
                               &kModelApi);
}
