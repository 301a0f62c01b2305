// The low-bit model plugin's C entry: ferry_plugin_negotiate and the ferry_model_api_t table,
// a thin boundary that validates C structs and forwards to ferry::lowbit::LowbitModel.
#include "lowbit_model.hpp"
#include "plugin_glue.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

struct ferry_model {
  explicit ferry_model(ferry::lowbit::LowbitConfig config) : model(std::move(config)) {}
  ferry::lowbit::LowbitModel model;
};

namespace {

namespace glue = ferry::model_glue;
constexpr const char* kWho = "lowbit model";

ferry_error_t* model_create(const ferry_model_create_args_t* args, ferry_model_t** out) {
  return ferry::sdk::guard([&] {
    if (args == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: create needs args and out");
    }
    *out = nullptr;
    if (args->struct_size < FERRY_STRUCT_SIZE(ferry_model_create_args_t, ep_size)) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "lowbit model: create args struct_size {} is too short (needs ep_size)",
                  args->struct_size);
    }
    *out = new ferry_model(ferry::lowbit::make_config(
        args->layout, args->tp_rank, args->tp_size, args->ep_rank, args->ep_size,
        glue::read_options(kWho, args), glue::read_config_json(args)));
  });
}

void model_destroy(ferry_model_t* model) { delete model; }

ferry_error_t* model_target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                   size_t num_checkpoint, ferry_layout_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: target_layout needs model and out");
    }
    *out = nullptr;
    *out = glue::new_layout(model->model.target_layout(
        glue::read_descs(kWho, checkpoint, num_checkpoint, "checkpoint catalog")));
  });
}

void model_layout_free(ferry_model_t* /*model*/, ferry_layout_t* layout) { glue::free_layout(layout); }

ferry_error_t* model_plan(ferry_model_t* model, const ferry_tensor_desc_t* entries,
                          size_t num_entries, ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "lowbit model: plan needs model and out");
    }
    *out = nullptr;
    *out = glue::new_plan(
        model->model.plan(glue::read_descs(kWho, entries, num_entries, "manifest entries")));
  });
}

void model_plan_free(ferry_model_t* /*model*/, ferry_plan_t* plan) { glue::free_plan(plan); }

ferry_error_t* model_locate(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint_tensor,
                            ferry_plan_t** out) {
  return ferry::sdk::guard([&] {
    if (model == nullptr || checkpoint_tensor == nullptr || out == nullptr) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "lowbit model: locate needs model, checkpoint_tensor and out");
    }
    *out = nullptr;
    const auto tensor = glue::read_descs(kWho, checkpoint_tensor, 1, "locate");
    *out = glue::new_plan({model->model.locate(tensor[0])});
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
  return ferry::sdk::negotiate(negotiation, FERRY_PLUGIN_MODEL, "lowbit", FERRY_LOWBIT_VERSION,
                               &kModelApi);
}
