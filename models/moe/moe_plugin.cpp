// The MoE model plugin's C entry: ferry_plugin_negotiate over the SDK's model table
// (ferry/sdk/model_plugin.hpp), which validates C structs and forwards to ferry::moe::MoeModel.
#include "moe_model.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/model_plugin.hpp>

#include <memory>

namespace {

struct MoeFamily {
  using Model = ferry::moe::MoeModel;
  using Tensor = ferry::moe::Tensor;
  static constexpr const char* kName = "moe";
  static constexpr const char* kVersion = FERRY_MOE_VERSION;
  // The option keys create accepts ([model.moe]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {"dtype", nullptr};

  static std::unique_ptr<Model> create(const ferry_model_create_args_t& args) {
    constexpr const char* kWho = "moe model";
    ferry::sdk::require_create_args(kWho, args, FERRY_STRUCT_SIZE(ferry_model_create_args_t, ep_size),
                                    "ep_size");
    return std::make_unique<Model>(ferry::moe::make_config(
        args.layout, args.tp_rank, args.tp_size, args.ep_rank, args.ep_size,
        ferry::sdk::read_model_options(kWho, args), ferry::sdk::read_config_json(args)));
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::ModelPlugin<MoeFamily>::negotiate(negotiation);
}
