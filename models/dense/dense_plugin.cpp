// The dense model plugin's C entry: ferry_plugin_negotiate over the SDK's model table
// (ferry/sdk/model_plugin.hpp), which validates C structs and forwards to ferry::dense::DenseModel.
#include "dense_model.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/model_plugin.hpp>

#include <memory>

namespace {

struct DenseFamily {
  using Model = ferry::dense::DenseModel;
  using Tensor = ferry::dense::Tensor;
  static constexpr const char* kName = "dense";
  static constexpr const char* kVersion = FERRY_DENSE_VERSION;
  // The option keys create accepts ([model.dense]; plugin ABI 1.3).
  static constexpr const char* kOptions[] = {"dtype", nullptr};

  static std::unique_ptr<Model> create(const ferry_model_create_args_t& args) {
    constexpr const char* kWho = "dense model";
    ferry::sdk::require_create_args(kWho, args, FERRY_STRUCT_SIZE(ferry_model_create_args_t, tp_size),
                                    "tp_size");
    return std::make_unique<Model>(ferry::dense::make_config(
        args.layout, args.tp_rank, args.tp_size, ferry::sdk::read_model_options(kWho, args),
        ferry::sdk::read_config_json(args)));
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::ModelPlugin<DenseFamily>::negotiate(negotiation);
}
