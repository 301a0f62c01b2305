// Tests of the built libferry_model_dense.so through its C table: dlopen, negotiate with the
// host's table, create, target_layout, plan, locate, and errors as ferry_error_t objects.
#include "common/host_api.hpp"
#include "tests/common/plugin_loader.hpp"

#include <ferry/plugin.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using ::testing::HasSubstr;

class DensePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = ferry::test::load_model_plugin("FERRY_DENSE_PLUGIN", "dense");
    ASSERT_NE(api_, nullptr);
    ASSERT_GE(api_->struct_size, FERRY_STRUCT_SIZE(ferry_model_api_t, locate));
  }

  ferry_model_t* create(const char* layout, uint32_t rank, uint32_t size,
                        std::vector<ferry_option_t> options = {}, const char* config = nullptr) {
    ferry_model_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    args.layout = layout;
    args.tp_rank = rank;
    args.tp_size = size;
    args.ep_size = 1;
    args.config_json = config;
    args.options = options.data();
    args.num_options = options.size();
    ferry_model_t* model = nullptr;
    last_error_.reset(api_->create(&args, &model));
    return model;
  }

  const ferry_model_api_t* api_ = nullptr;
  ferry::ErrorPtr last_error_;
};

ferry_tensor_desc_t desc(const char* name, std::vector<uint64_t> shape,
                         ferry_dtype_t dtype = FERRY_DTYPE_BF16) {
  ferry_tensor_desc_t d{};
  d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
  d.name = name;
  d.dtype = dtype;
  d.ndim = static_cast<uint32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  return d;
}

// A one-layer Qwen2-style checkpoint with biases and tied embeddings.
struct Catalog {
  std::vector<std::string> names = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.self_attn.k_proj.bias",
      "model.layers.0.self_attn.v_proj.bias",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.norm.weight",
  };
  std::vector<std::vector<uint64_t>> shapes = {{32, 16}, {16},    {16, 16}, {8, 16}, {8, 16},
                                               {16},     {8},     {8},      {16, 16}, {16},
                                               {24, 16}, {24, 16}, {16, 24}, {16}};
  std::vector<ferry_tensor_desc_t> descs() const {
    std::vector<ferry_tensor_desc_t> out;
    for (size_t i = 0; i < names.size(); ++i) out.push_back(desc(names[i].c_str(), shapes[i]));
    return out;
  }
};

TEST_F(DensePluginTest, TargetLayoutPlanAndLocateThroughTheCTable) {
  ferry_option_t dtype{"dtype", "f32"};
  ferry_model_t* model = create("engine", 1, 2, {dtype}, R"({"tie_word_embeddings": true})");
  ASSERT_NE(model, nullptr) << ferry::error_message(last_error_.get());

  const Catalog catalog;
  const std::vector<ferry_tensor_desc_t> descs = catalog.descs();
  ferry_layout_t* layout = nullptr;
  ferry::ErrorPtr error(api_->target_layout(model, descs.data(), descs.size(), &layout));
  ASSERT_EQ(error, nullptr) << ferry::error_message(error.get());
  ASSERT_NE(layout, nullptr);
  std::vector<std::string> names;
  for (size_t i = 0; i < layout->num_params; ++i) names.push_back(layout->params[i].name);
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                         "model.layers.0.self_attn.qkv_proj.weight",
                         "model.layers.0.self_attn.qkv_proj.bias",
                         "model.layers.0.self_attn.o_proj.weight",
                         "model.layers.0.post_attention_layernorm.weight",
                         "model.layers.0.mlp.gate_up_proj.weight",
                         "model.layers.0.mlp.down_proj.weight", "model.norm.weight"));
  const ferry_tensor_desc_t& qkv = layout->params[2];
  EXPECT_EQ(qkv.dtype, FERRY_DTYPE_F32);
  ASSERT_EQ(qkv.ndim, 2u);
  EXPECT_EQ(qkv.shape[0], 8u + 4u + 4u);
  EXPECT_EQ(qkv.shape[1], 16u);

  // One bucket: k_proj.bias then the embedding.
  std::vector<ferry_tensor_desc_t> bucket = {descs[6], descs[0]};
  ferry_plan_t* plan = nullptr;
  error.reset(api_->plan(model, bucket.data(), bucket.size(), &plan));
  ASSERT_EQ(error, nullptr) << ferry::error_message(error.get());
  ASSERT_EQ(plan->num_ops, 2u);
  const ferry_plan_op_t& bias = plan->ops[0];
  EXPECT_EQ(bias.src_tensor, 0u);
  EXPECT_EQ(bias.dst_param, 3u);
  EXPECT_EQ(bias.src_offset, 4u);  // rank 1's half of 8
  EXPECT_EQ(bias.dst_offset, 8u);  // after rank 1's 8 q-bias elements
  EXPECT_EQ(bias.rows * bias.cols, 4u);
  EXPECT_EQ(bias.transform, FERRY_TRANSFORM_CAST);
  EXPECT_EQ(bias.src_dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(bias.dst_dtype, FERRY_DTYPE_F32);
  const ferry_plan_op_t& embed = plan->ops[1];
  EXPECT_EQ(embed.src_tensor, 1u);
  EXPECT_EQ(embed.dst_param, 0u);
  EXPECT_EQ(embed.src_offset, 16u * 16u);
  EXPECT_EQ(embed.rows * embed.cols, 16u * 16u);
  api_->plan_free(model, plan);

  // locate: the down_proj shard of rank 1 is columns [12, 24) of [16, 24], i.e. all of its param.
  ferry_tensor_desc_t down = descs[12];
  ferry_plan_t* located = nullptr;
  error.reset(api_->locate(model, &down, &located));
  ASSERT_EQ(error, nullptr) << ferry::error_message(error.get());
  ASSERT_EQ(located->num_ops, 1u);
  EXPECT_EQ(located->ops[0].dst_param, 7u);
  EXPECT_EQ(located->ops[0].rows, 16u);
  EXPECT_EQ(located->ops[0].cols, 12u);
  EXPECT_EQ(located->ops[0].dst_row_stride, 12u);
  api_->plan_free(model, located);

  // Errors come back as objects with a code and a message naming the tensor.
  ferry_tensor_desc_t stray = desc("model.layers.0.mlp.shared_expert.weight", {4});
  error.reset(api_->plan(model, &stray, 1, &plan));
  EXPECT_EQ(ferry::error_code(error.get()), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(ferry::error_message(error.get()), HasSubstr("shared_expert"));
  EXPECT_EQ(plan, nullptr);

  api_->layout_free(model, layout);
  api_->destroy(model);
}

TEST_F(DensePluginTest, CreateRefusesUnknownLayoutOptionAndRank) {
  EXPECT_EQ(create("fused", 0, 1), nullptr);
  EXPECT_EQ(ferry::error_code(last_error_.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(ferry::error_message(last_error_.get()), HasSubstr("fused"));

  ferry_option_t bogus{"quantize", "fp8"};
  EXPECT_EQ(create("engine", 0, 1, {bogus}), nullptr);
  EXPECT_EQ(ferry::error_code(last_error_.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(ferry::error_message(last_error_.get()), HasSubstr("quantize"));

  EXPECT_EQ(create("engine", 4, 4), nullptr);
  EXPECT_EQ(ferry::error_code(last_error_.get()), FERRY_STATUS_INVALID_ARGUMENT);
}

TEST_F(DensePluginTest, TargetLayoutReportsMissingTensorsAsNotFound) {
  ferry_model_t* model = create("hf", 0, 1);
  ASSERT_NE(model, nullptr);
  Catalog catalog;
  catalog.names.pop_back();  // model.norm.weight
  catalog.shapes.pop_back();
  const std::vector<ferry_tensor_desc_t> descs = catalog.descs();
  ferry_layout_t* layout = nullptr;
  ferry::ErrorPtr error(api_->target_layout(model, descs.data(), descs.size(), &layout));
  EXPECT_EQ(ferry::error_code(error.get()), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(ferry::error_message(error.get()), HasSubstr("model.norm.weight"));
  EXPECT_EQ(layout, nullptr);
  api_->destroy(model);
}

}  // namespace
