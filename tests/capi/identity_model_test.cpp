// tests/capi/identity_model_test.cpp: the built libferry_model_identity.so, loaded and vetted by
// the registry: the target layout is the catalog itself, plans are whole-tensor copies, and
// unknown or mis-shaped tensors are refused by name.
#include <ferry/plugin.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/host_api.hpp"
#include "registry/registry.hpp"

namespace {

ferry_tensor_desc_t desc(const char* name, std::vector<uint64_t> shape, ferry_dtype_t dtype) {
  ferry_tensor_desc_t d{};
  d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
  d.name = name;
  d.dtype = dtype;
  d.ndim = static_cast<uint32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  return d;
}

class IdentityModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("FERRY_IDENTITY_PLUGIN");
    ASSERT_NE(path, nullptr) << "FERRY_IDENTITY_PLUGIN must name the built plugin (meson sets it)";
    plugin_ = ferry::registry::Registry::load_file(path);
    ASSERT_EQ(plugin_->info().name, "identity");
    api_ = plugin_->model();
    ASSERT_NE(api_, nullptr);
    ferry_model_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    args.tp_size = 1;
    args.ep_size = 1;
    ferry::ErrorPtr error(api_->create(&args, &model_));
    ASSERT_EQ(error, nullptr) << ferry::error_message(error.get());
  }
  void TearDown() override {
    if (model_ != nullptr) api_->destroy(model_);
  }

  // The error of a call as "CODE: message" ("" on success), freeing it.
  static std::string outcome(ferry_error_t* raw) {
    ferry::ErrorPtr error(raw);
    if (!error) return "";
    return std::string(ferry::status_name(ferry::error_code(error.get()))) + ": " +
           ferry::error_message(error.get());
  }

  std::shared_ptr<ferry::registry::LoadedPlugin> plugin_;
  const ferry_model_api_t* api_ = nullptr;
  ferry_model_t* model_ = nullptr;
};

const std::vector<ferry_tensor_desc_t> kCatalog = {
    desc("embed.weight", {10, 4}, FERRY_DTYPE_BF16),
    desc("layers.0.bias", {4}, FERRY_DTYPE_F32),
    desc("step", {}, FERRY_DTYPE_I64),
};

TEST_F(IdentityModel, TargetLayoutIsTheCatalogInOrder) {
  ferry_layout_t* layout = nullptr;
  ASSERT_EQ(outcome(api_->target_layout(model_, kCatalog.data(), kCatalog.size(), &layout)), "");
  ASSERT_EQ(layout->num_params, kCatalog.size());
  for (size_t i = 0; i < kCatalog.size(); ++i) {
    EXPECT_STREQ(layout->params[i].name, kCatalog[i].name);
    EXPECT_EQ(layout->params[i].dtype, kCatalog[i].dtype);
    EXPECT_EQ(layout->params[i].ndim, kCatalog[i].ndim);
    for (uint32_t k = 0; k < kCatalog[i].ndim; ++k) {
      EXPECT_EQ(layout->params[i].shape[k], kCatalog[i].shape[k]);
    }
  }
  api_->layout_free(model_, layout);
}

TEST_F(IdentityModel, PlanIsOneWholeCopyPerEntry) {
  ferry_layout_t* layout = nullptr;
  ASSERT_EQ(outcome(api_->target_layout(model_, kCatalog.data(), kCatalog.size(), &layout)), "");
  api_->layout_free(model_, layout);
  // A bucket holding two of the tensors, in another order than the catalog.
  const std::vector<ferry_tensor_desc_t> bucket = {kCatalog[2], kCatalog[0]};
  ferry_plan_t* plan = nullptr;
  ASSERT_EQ(outcome(api_->plan(model_, bucket.data(), bucket.size(), &plan)), "");
  ASSERT_EQ(plan->num_ops, 2u);
  EXPECT_EQ(plan->ops[0].src_tensor, 0u);
  EXPECT_EQ(plan->ops[0].dst_param, 2u);
  EXPECT_EQ(plan->ops[0].rows * plan->ops[0].cols, 1u);  // a scalar
  EXPECT_EQ(plan->ops[1].src_tensor, 1u);
  EXPECT_EQ(plan->ops[1].dst_param, 0u);
  EXPECT_EQ(plan->ops[1].rows, 1u);
  EXPECT_EQ(plan->ops[1].cols, 40u);
  EXPECT_EQ(plan->ops[1].transform, FERRY_TRANSFORM_COPY);
  EXPECT_EQ(plan->ops[1].src_dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(plan->ops[1].dst_dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(plan->ops[1].dst_offset, 0u);
  api_->plan_free(model_, plan);
}

TEST_F(IdentityModel, UnknownAndMisShapedTensorsAreRefusedByName) {
  ferry_layout_t* layout = nullptr;
  ASSERT_EQ(outcome(api_->target_layout(model_, kCatalog.data(), kCatalog.size(), &layout)), "");
  api_->layout_free(model_, layout);
  ferry_plan_t* plan = nullptr;
  const auto unknown = desc("lm_head.weight", {10, 4}, FERRY_DTYPE_BF16);
  EXPECT_EQ(outcome(api_->plan(model_, &unknown, 1, &plan)),
            "NOT_FOUND: identity model: tensor 'lm_head.weight' is not a parameter of this "
            "receiver");
  const auto reshaped = desc("embed.weight", {4, 10}, FERRY_DTYPE_BF16);
  EXPECT_EQ(outcome(api_->plan(model_, &reshaped, 1, &plan)),
            "INVALID_ARGUMENT: identity model: tensor 'embed.weight' is BF16 [4, 10], the "
            "parameter is BF16 [10, 4] (the identity model copies without casting or reshaping)");
  const auto recast = desc("layers.0.bias", {4}, FERRY_DTYPE_F16);
  EXPECT_NE(outcome(api_->plan(model_, &recast, 1, &plan)).find("is F16 [4], the parameter is F32"),
            std::string::npos);
  EXPECT_EQ(plan, nullptr);
}

TEST_F(IdentityModel, DuplicateCatalogNameIsRefused) {
  const std::vector<ferry_tensor_desc_t> twice = {kCatalog[0], kCatalog[0]};
  ferry_layout_t* layout = nullptr;
  EXPECT_EQ(outcome(api_->target_layout(model_, twice.data(), twice.size(), &layout)),
            "INVALID_ARGUMENT: identity model: checkpoint tensor 'embed.weight' appears twice in "
            "the catalog");
  EXPECT_EQ(layout, nullptr);
}

TEST_F(IdentityModel, PlanBeforeLayoutIsFailedPrecondition) {
  ferry_plan_t* plan = nullptr;
  EXPECT_EQ(outcome(api_->plan(model_, kCatalog.data(), 1, &plan)),
            "FAILED_PRECONDITION: identity model: plan before target_layout (the layout is not "
            "known yet)");
}

TEST_F(IdentityModel, LocateFindsTheWholeParameter) {
  ferry_layout_t* layout = nullptr;
  ASSERT_EQ(outcome(api_->target_layout(model_, kCatalog.data(), kCatalog.size(), &layout)), "");
  api_->layout_free(model_, layout);
  const auto by_name = desc("layers.0.bias", {}, FERRY_DTYPE_INVALID);
  ferry_plan_t* plan = nullptr;
  ASSERT_EQ(outcome(api_->locate(model_, &by_name, &plan)), "");
  ASSERT_EQ(plan->num_ops, 1u);
  EXPECT_EQ(plan->ops[0].dst_param, 1u);
  EXPECT_EQ(plan->ops[0].cols, 4u);
  api_->plan_free(model_, plan);
  const auto missing = desc("nope", {}, FERRY_DTYPE_INVALID);
  EXPECT_EQ(outcome(api_->locate(model_, &missing, &plan)),
            "NOT_FOUND: identity model: no parameter named 'nope'");
}

TEST_F(IdentityModel, TensorParallelismIsRefused) {
  ferry_model_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
  args.tp_rank = 0;
  args.tp_size = 2;
  ferry_model_t* model = nullptr;
  EXPECT_EQ(outcome(api_->create(&args, &model)),
            "INVALID_ARGUMENT: identity model: tp_size 2 is not supported (the identity layout "
            "is unsharded)");
  EXPECT_EQ(model, nullptr);
}

}  // namespace
