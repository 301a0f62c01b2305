// ModelBinding: calls a model plugin's C table with error and ownership handling.
#include "update/model_binding.hpp"

#include "common/host_api.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <functional>
#include <unordered_set>

namespace ferry::update {
namespace {

constexpr std::size_t kRequiredApiSize = FERRY_STRUCT_SIZE(ferry_model_api_t, plan_free);
constexpr std::size_t kOpSize = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);

}  // namespace

ModelBinding::ModelBinding(const ferry_model_api_t* api, std::string name,
                           std::shared_ptr<const void> keep_alive)
    : api_(api), name_(std::move(name)), keep_alive_(std::move(keep_alive)) {}

std::unique_ptr<ModelBinding> ModelBinding::create(const ferry_model_api_t* api,
                                                   std::string plugin_name,
                                                   const ferry_model_create_args_t& args,
                                                   std::shared_ptr<const void> keep_alive) {
  if (api == nullptr || api->struct_size < kRequiredApiSize || api->create == nullptr ||
      api->destroy == nullptr || api->target_layout == nullptr || api->layout_free == nullptr ||
      api->plan == nullptr || api->plan_free == nullptr) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "model plugin '{}': its function table is short or lacks a required function",
         plugin_name);
  }
  std::unique_ptr<ModelBinding> binding(
      new ModelBinding(api, std::move(plugin_name), std::move(keep_alive)));
  ferry_model_t* model = nullptr;
  throw_if_error(api->create(&args, &model), "model plugin '" + binding->name_ + "' create");
  if (model == nullptr) {
    fail(FERRY_STATUS_INTERNAL, "model plugin '{}' create returned no instance", binding->name_);
  }
  binding->model_ = model;
  return binding;
}

ModelBinding::~ModelBinding() {
  if (model_ != nullptr) api_->destroy(model_);
}

const std::vector<LayoutParam>& ModelBinding::target_layout(
    std::span<const ferry_tensor_desc_t> catalog) {
  ferry_layout_t* raw = nullptr;
  throw_if_error(api_->target_layout(model_, catalog.data(), catalog.size(), &raw),
                 "model plugin '" + name_ + "' target_layout");
  if (raw == nullptr) {
    fail(FERRY_STATUS_INTERNAL, "model plugin '{}' target_layout returned no layout", name_);
  }
  std::unique_ptr<ferry_layout_t, std::function<void(ferry_layout_t*)>> owned(
      raw, [this](ferry_layout_t* l) { api_->layout_free(model_, l); });
  if (raw->struct_size < FERRY_STRUCT_SIZE(ferry_layout_t, num_params) ||
      (raw->num_params > 0 && raw->params == nullptr)) {
    fail(FERRY_STATUS_INCOMPATIBLE, "model plugin '{}' returned a malformed layout", name_);
  }
  std::vector<LayoutParam> layout;
  layout.reserve(raw->num_params);
  std::unordered_set<std::string> names;
  for (std::size_t i = 0; i < raw->num_params; ++i) {
    const ferry_tensor_desc_t& d = raw->params[i];
    if (d.struct_size < FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape) || d.name == nullptr ||
        d.name[0] == '\0' || d.ndim > FERRY_MAX_DIMS || dtype_size(d.dtype) == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "model plugin '{}': layout parameter #{} has no name, an unknown dtype or too many "
           "dims",
           name_, i);
    }
    LayoutParam p;
    p.name = d.name;
    p.dtype = d.dtype;
    p.shape.assign(d.shape, d.shape + d.ndim);
    if (!byte_size(p.dtype, p.shape)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "model plugin '{}': layout parameter '{}' {} overflows",
           name_, p.name, shape_string(p.shape));
    }
    if (!names.insert(p.name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "model plugin '{}': layout names '{}' twice", name_,
           p.name);
    }
    layout.push_back(std::move(p));
  }
  layout_ = std::move(layout);
  return *layout_;
}

const std::vector<LayoutParam>& ModelBinding::layout() const {
  if (!layout_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "model plugin '{}': the target layout is not known yet (call target_layout)", name_);
  }
  return *layout_;
}

std::vector<ferry_plan_op_t> ModelBinding::take_plan(ferry_plan_t* plan, const char* call) {
  if (plan == nullptr) {
    fail(FERRY_STATUS_INTERNAL, "model plugin '{}' {} returned no plan", name_, call);
  }
  std::unique_ptr<ferry_plan_t, std::function<void(ferry_plan_t*)>> owned(
      plan, [this](ferry_plan_t* p) { api_->plan_free(model_, p); });
  if (plan->struct_size < FERRY_STRUCT_SIZE(ferry_plan_t, num_ops) ||
      (plan->num_ops > 0 && plan->ops == nullptr)) {
    fail(FERRY_STATUS_INCOMPATIBLE, "model plugin '{}' {} returned a malformed plan", name_, call);
  }
  std::vector<ferry_plan_op_t> ops(plan->ops, plan->ops + plan->num_ops);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    // The array stride is this header's sizeof, so an op from another struct layout cannot be
    // read safely: refuse rather than guess.
    if (ops[i].struct_size < kOpSize) {
      fail(FERRY_STATUS_INCOMPATIBLE, "model plugin '{}' {}: op #{} has struct_size {} < {}",
           name_, call, i, ops[i].struct_size, kOpSize);
    }
  }
  return ops;
}

std::vector<ferry_plan_op_t> ModelBinding::plan(std::span<const ferry_tensor_desc_t> entries) {
  ferry_plan_t* raw = nullptr;
  throw_if_error(api_->plan(model_, entries.data(), entries.size(), &raw),
                 "model plugin '" + name_ + "' plan");
  return take_plan(raw, "plan");
}

std::vector<ferry_plan_op_t> ModelBinding::locate(const ferry_tensor_desc_t& tensor) {
  if (api_->struct_size < FERRY_STRUCT_SIZE(ferry_model_api_t, locate) || api_->locate == nullptr) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "model plugin '{}' does not implement locate", name_);
  }
  ferry_plan_t* raw = nullptr;
  throw_if_error(api_->locate(model_, &tensor, &raw), "model plugin '" + name_ + "' locate");
  return take_plan(raw, "locate");
}

}  // namespace ferry::update
