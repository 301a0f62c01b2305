// ferry/sdk/model_plugin.hpp: the C boundary of a model plugin written once: the
// ferry_model_api_t table and its negotiation built over a C++ model class, so that a model family
// writes only its mapping logic and how to create it from ferry_model_create_args_t.
//
// A plugin describes its family with a struct and exports the entry through it:
//
//   struct MoeFamily {
//     using Model = ferry::moe::MoeModel;     // the instance behind ferry_model_t
//     using Tensor = ferry::moe::Tensor;      // aggregate {std::string name; ferry_dtype_t dtype;
//                                             //            std::vector<std::uint64_t> shape;}
//     static constexpr const char* kName = "moe";             // must match the file name
//     static constexpr const char* kVersion = FERRY_MOE_VERSION;
//     // the option keys create accepts ([model.moe]), NULL-terminated; sdk::kNoOptions for none
//     static constexpr const char* const* kOptions = ferry::moe::kOptionKeys;
//     // args is non-NULL; struct_size is not checked yet (see require_create_args).
//     static std::unique_ptr<Model> create(const ferry_model_create_args_t& args);
//   };
//   extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
//       ferry_plugin_negotiation_t* negotiation) {
//     return ferry::sdk::ModelPlugin<MoeFamily>::negotiate(negotiation);
//   }
//
// Model must provide, with the threading of ferry_model_api_t (target_layout serialized by the
// host; plan and locate from any thread, concurrently):
//   std::vector<Tensor> target_layout(const std::vector<Tensor>& catalog);
//   std::vector<ferry_plan_op_t> plan(const std::vector<Tensor>& entries) const;
//   ferry_plan_op_t locate(const Tensor& tensor) const;
// each throwing ferry::Error; the table turns every exception into a ferry_error_t. Every error
// the table itself raises is prefixed "<kName> model:". Header-only: it links nothing new.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ferry::sdk {

// Key/value options of a model's config section, in the order given.
using ModelOptions = std::vector<std::pair<std::string, std::string>>;

// A layout and the storage its pointers refer to; allocated and freed as one.
struct LayoutBlock : ferry_layout_t {
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> descs;
};

// A plan and its operations; allocated and freed as one.
struct PlanBlock : ferry_plan_t {
  std::vector<ferry_plan_op_t> storage;
};

// Copies C tensor descriptions into C++ values. Throws INVALID_ARGUMENT ("<who>: <what> ...")
// for a NULL array with count > 0, a struct_size short of `shape`, a NULL name or ndim above
// FERRY_MAX_DIMS. The dtype and shape are not judged here: that is the model's business.
template <typename Tensor>
std::vector<Tensor> read_tensor_descs(const char* who, const ferry_tensor_desc_t* descs,
                                      size_t count, const char* what) {
  if (count > 0 && descs == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} is NULL with {} tensors", who, what, count);
  }
  std::vector<Tensor> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ferry_tensor_desc_t& d = descs[i];
    if (d.struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor {} has struct_size {}, needs at least {}",
           who, what, i, d.struct_size, FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape));
    }
    if (d.name == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor {} has no name", who, what, i);
    }
    if (d.ndim > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} tensor '{}' has {} dims (max {})", who, what,
           d.name, d.ndim, FERRY_MAX_DIMS);
    }
    out.push_back(Tensor{d.name, d.dtype, std::vector<std::uint64_t>(d.shape, d.shape + d.ndim)});
  }
  return out;
}

// Throws INVALID_ARGUMENT when create args stop before a field the family needs
// (`needed` = FERRY_STRUCT_SIZE(ferry_model_create_args_t, <field>), named `field`).
inline void require_create_args(const char* who, const ferry_model_create_args_t& args,
                                size_t needed, const char* field) {
  if (args.struct_size < needed) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: create args struct_size {} is too short (needs {})",
         who, args.struct_size, field);
  }
}

// The options of create args (none when struct_size does not reach them). Throws
// INVALID_ARGUMENT for a NULL array or a NULL key or value.
inline ModelOptions read_model_options(const char* who, const ferry_model_create_args_t& args) {
  ModelOptions options;
  if (args.struct_size < FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options) ||
      args.num_options == 0) {
    return options;
  }
  if (args.options == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: options is NULL with {} options", who,
         args.num_options);
  }
  for (size_t i = 0; i < args.num_options; ++i) {
    const ferry_option_t& o = args.options[i];
    if (o.key == nullptr || o.value == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: option {} has a NULL key or value", who, i);
    }
    options.emplace_back(o.key, o.value);
  }
  return options;
}

// config_json when struct_size reaches it, else NULL.
inline const char* read_config_json(const ferry_model_create_args_t& args) {
  return args.struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, config_json)
             ? args.config_json
             : nullptr;
}

// A heap layout of `params` (each with name, dtype, shape), freed with free_layout.
template <typename Tensor>
ferry_layout_t* new_layout(const std::vector<Tensor>& params) {
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
    d.ndim = static_cast<std::uint32_t>(params[i].shape.size());
    for (size_t k = 0; k < params[i].shape.size(); ++k) d.shape[k] = params[i].shape[k];
  }
  block->struct_size = FERRY_STRUCT_SIZE(ferry_layout_t, num_params);
  block->params = block->descs.data();
  block->num_params = block->descs.size();
  return block.release();
}

// A heap plan owning `ops`, freed with free_plan.
inline ferry_plan_t* new_plan(std::vector<ferry_plan_op_t> ops) {
  auto block = std::make_unique<PlanBlock>();
  block->storage = std::move(ops);
  block->struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  block->ops = block->storage.data();
  block->num_ops = block->storage.size();
  return block.release();
}

inline void free_layout(ferry_layout_t* layout) { delete static_cast<LayoutBlock*>(layout); }
inline void free_plan(ferry_plan_t* plan) { delete static_cast<PlanBlock*>(plan); }

// The model table over Family (see the top of this file). ferry_model_t is never defined: the
// handle the host holds is the Family::Model pointer itself, opaque to it.
template <typename Family>
class ModelPlugin {
 public:
  using Model = typename Family::Model;
  using Tensor = typename Family::Tensor;

  static const ferry_model_api_t* api() noexcept { return &kApi; }

  // The whole body of the plugin's ferry_plugin_negotiate.
  static ferry_error_t* negotiate(ferry_plugin_negotiation_t* negotiation) noexcept {
    return sdk::negotiate(negotiation, FERRY_PLUGIN_MODEL, Family::kName, Family::kVersion,
                          &kApi, Family::kOptions);
  }

 private:
  static Model& self(ferry_model_t* model) { return *reinterpret_cast<Model*>(model); }
  static std::string who() { return std::string(Family::kName) + " model"; }

  static ferry_error_t* create(const ferry_model_create_args_t* args, ferry_model_t** out) {
    return guard([&] {
      if (args == nullptr || out == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: create needs args and out", who());
      }
      *out = nullptr;
      std::unique_ptr<Model> model = Family::create(*args);
      *out = reinterpret_cast<ferry_model_t*>(model.release());
    });
  }

  static void destroy(ferry_model_t* model) { delete reinterpret_cast<Model*>(model); }

  static ferry_error_t* target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                      size_t num_checkpoint, ferry_layout_t** out) {
    return guard([&] {
      if (model == nullptr || out == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: target_layout needs model and out", who());
      }
      *out = nullptr;
      *out = new_layout(self(model).target_layout(read_tensor_descs<Tensor>(
          who().c_str(), checkpoint, num_checkpoint, "checkpoint catalog")));
    });
  }

  static void layout_free(ferry_model_t* /*model*/, ferry_layout_t* layout) {
    free_layout(layout);
  }

  static ferry_error_t* plan(ferry_model_t* model, const ferry_tensor_desc_t* entries,
                             size_t num_entries, ferry_plan_t** out) {
    return guard([&] {
      if (model == nullptr || out == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: plan needs model and out", who());
      }
      *out = nullptr;
      *out = new_plan(self(model).plan(
          read_tensor_descs<Tensor>(who().c_str(), entries, num_entries, "manifest entries")));
    });
  }

  static void plan_free(ferry_model_t* /*model*/, ferry_plan_t* plan) { free_plan(plan); }

  static ferry_error_t* locate(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint_tensor,
                               ferry_plan_t** out) {
    return guard([&] {
      if (model == nullptr || checkpoint_tensor == nullptr || out == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: locate needs model, checkpoint_tensor and out",
             who());
      }
      *out = nullptr;
      const auto tensor = read_tensor_descs<Tensor>(who().c_str(), checkpoint_tensor, 1, "locate");
      *out = new_plan({self(model).locate(tensor[0])});
    });
  }

  static constexpr ferry_model_api_t kApi = {
      FERRY_STRUCT_SIZE(ferry_model_api_t, locate),
      create,
      destroy,
      target_layout,
      layout_free,
      plan,
      plan_free,
      locate,
  };
};

}  // namespace ferry::sdk
