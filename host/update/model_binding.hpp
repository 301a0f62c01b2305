// update/model_binding.hpp: one instance of a loaded model plugin (its const ferry_model_api_t
// table plus the ferry_model_t it created), as an RAII PlanProvider. Every plugin error becomes a
// ferry::Error prefixed with the plugin's name and the call; every plugin-allocated object is
// freed with the plugin's own deleter (layout_free, plan_free, destroy).
#pragma once

#include "update/plan_provider.hpp"

#include <memory>
#include <optional>

namespace ferry::update {

class ModelBinding final : public PlanProvider {
 public:
  // Checks the table (struct_size, required functions) and calls create(args). `keep_alive`
  // (e.g. the registry's LoadedPlugin) is held until after destroy so the code stays mapped.
  // Throws INCOMPATIBLE for a short table, or the plugin's error.
  static std::unique_ptr<ModelBinding> create(const ferry_model_api_t* api, std::string plugin_name,
                                              const ferry_model_create_args_t& args,
                                              std::shared_ptr<const void> keep_alive = {});
  ~ModelBinding() override;
  ModelBinding(const ModelBinding&) = delete;
  ModelBinding& operator=(const ModelBinding&) = delete;

  // Asks the plugin for this rank's parameters given the full checkpoint catalog, validates them
  // (known dtype, <= FERRY_MAX_DIMS dims, unique non-empty names) and keeps them as layout().
  const std::vector<LayoutParam>& target_layout(std::span<const ferry_tensor_desc_t> catalog);

  const std::vector<LayoutParam>& layout() const override;
  std::vector<ferry_plan_op_t> plan(std::span<const ferry_tensor_desc_t> entries) override;

  // The single-op plan reading the parameter region that holds checkpoint tensor `tensor`
  // (get_weights_by_name). UNIMPLEMENTED when the plugin has no locate.
  std::vector<ferry_plan_op_t> locate(const ferry_tensor_desc_t& tensor);

  const std::string& plugin_name() const noexcept { return name_; }

 private:
  ModelBinding(const ferry_model_api_t* api, std::string name,
               std::shared_ptr<const void> keep_alive);
  std::vector<ferry_plan_op_t> take_plan(ferry_plan_t* plan, const char* call);

  const ferry_model_api_t* api_;
  std::string name_;
  std::shared_ptr<const void> keep_alive_;
  ferry_model_t* model_ = nullptr;
  std::optional<std::vector<LayoutParam>> layout_;
};

}  // namespace ferry::update
