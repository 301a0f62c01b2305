// Tests of ModelBinding over a model plugin's C table (an identity model defined here with C
// linkage semantics, the way a plugin fills its table), and of the engine driven through it.
#include "update_fixture.hpp"

#include "common/host_api.hpp"
#include "store/cpu_weight_store.hpp"
#include "update/model_binding.hpp"
#include "update/update_engine.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace ferry::update {
namespace {

using namespace ferry::update::testing;

// ---- an identity model behind the C ABI ----------------------------------------------------

struct IdentityModel {
  std::vector<std::string> names;
  std::vector<ferry_tensor_desc_t> params;
  int live_plans = 0;
  int live_layouts = 0;
};

int g_destroyed = 0;

ferry_error_t* make_error(ferry_status_code_t code, const char* message) {
  return host_api_table()->error_new(code, message);
}

ferry_error_t* identity_create(const ferry_model_create_args_t* args, ferry_model_t** out) {
  if (args->layout != nullptr && std::strcmp(args->layout, "hf") != 0) {
    return make_error(FERRY_STATUS_INVALID_ARGUMENT, "layout must be 'hf'");
  }
  *out = reinterpret_cast<ferry_model_t*>(new IdentityModel());
  return nullptr;
}

void identity_destroy(ferry_model_t* model) {
  delete reinterpret_cast<IdentityModel*>(model);
  ++g_destroyed;
}

ferry_error_t* identity_target_layout(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                      size_t n, ferry_layout_t** out) {
  auto* m = reinterpret_cast<IdentityModel*>(model);
  m->names.clear();
  m->params.assign(checkpoint, checkpoint + n);
  for (size_t i = 0; i < n; ++i) m->names.emplace_back(checkpoint[i].name);
  for (size_t i = 0; i < n; ++i) m->params[i].name = m->names[i].c_str();
  auto* layout = new ferry_layout_t{};
  layout->struct_size = FERRY_STRUCT_SIZE(ferry_layout_t, num_params);
  layout->params = m->params.data();
  layout->num_params = n;
  ++m->live_layouts;
  *out = layout;
  return nullptr;
}

void identity_layout_free(ferry_model_t* model, ferry_layout_t* layout) {
  --reinterpret_cast<IdentityModel*>(model)->live_layouts;
  delete layout;
}

ferry_error_t* identity_plan(ferry_model_t* model, const ferry_tensor_desc_t* entries, size_t n,
                             ferry_plan_t** out) {
  auto* m = reinterpret_cast<IdentityModel*>(model);
  std::vector<LayoutParam> layout;
  for (const auto& p : m->params) layout.push_back({p.name, p.dtype, {p.shape, p.shape + p.ndim}});
  IdentityPlans plans(layout);
  auto ops = plans.plan(std::span(entries, n));
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(entries[i].name, "poison") == 0) {
      return make_error(FERRY_STATUS_INVALID_ARGUMENT, "tensor 'poison' is not in this model");
    }
  }
  auto* plan = new ferry_plan_t{};
  plan->struct_size = FERRY_STRUCT_SIZE(ferry_plan_t, num_ops);
  auto* copy = new ferry_plan_op_t[ops.size()];
  std::copy(ops.begin(), ops.end(), copy);
  plan->ops = copy;
  plan->num_ops = ops.size();
  ++m->live_plans;
  *out = plan;
  return nullptr;
}

void identity_plan_free(ferry_model_t* model, ferry_plan_t* plan) {
  --reinterpret_cast<IdentityModel*>(model)->live_plans;
  delete[] plan->ops;
  delete plan;
}

const ferry_model_api_t kIdentityApi = {
    FERRY_STRUCT_SIZE(ferry_model_api_t, plan_free),  // no locate
    identity_create,
    identity_destroy,
    identity_target_layout,
    identity_layout_free,
    identity_plan,
    identity_plan_free,
    nullptr,
};

ferry_model_create_args_t hf_args() {
  ferry_model_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
  args.layout = "hf";
  args.tp_size = 1;
  args.ep_size = 1;
  return args;
}

const std::vector<LayoutParam> kCatalog = {{"a", FERRY_DTYPE_F32, {16, 8}},
                                           {"b", FERRY_DTYPE_BF16, {300}}};

TEST(ModelBinding, ComputesLayoutAndPlansAndFreesEverything) {
  const int destroyed_before = g_destroyed;
  {
    auto binding = ModelBinding::create(&kIdentityApi, "testidentity", hf_args());
    EXPECT_EQ(error_of([&] { binding->layout(); }).code(), FERRY_STATUS_FAILED_PRECONDITION);
    const auto catalog = descs_of(kCatalog);
    const auto& layout = binding->target_layout(catalog);
    ASSERT_EQ(layout.size(), 2u);
    EXPECT_EQ(layout[1].name, "b");
    EXPECT_EQ(layout[1].shape, std::vector<std::uint64_t>{300});
    const auto ops = binding->plan(std::span(catalog).subspan(1));
    ASSERT_EQ(ops.size(), 1u);
    EXPECT_EQ(ops[0].dst_param, 1u);
    EXPECT_EQ(ops[0].cols, 300u);
    EXPECT_EQ(error_of([&] { binding->locate(catalog[0]); }).code(), FERRY_STATUS_UNIMPLEMENTED);
  }
  EXPECT_EQ(g_destroyed, destroyed_before + 1);
}

TEST(ModelBinding, PluginErrorsCarryThePluginNameAndCall) {
  auto args = hf_args();
  args.layout = "engine";
  const auto e = error_of([&] { ModelBinding::create(&kIdentityApi, "testidentity", args); });
  EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(e.what()).find("model plugin 'testidentity' create: layout must be 'hf'"),
            std::string::npos)
      << e.what();

  auto binding = ModelBinding::create(&kIdentityApi, "testidentity", hf_args());
  binding->target_layout(descs_of(kCatalog));
  const std::vector<LayoutParam> poison_tensors = {{"poison", FERRY_DTYPE_F32, {1}}};
  const auto poison = descs_of(poison_tensors);  // names point into poison_tensors
  const auto p = error_of([&] { binding->plan(poison); });
  EXPECT_NE(std::string(p.what()).find("'testidentity' plan"), std::string::npos) << p.what();
}

TEST(ModelBinding, ShortTableIsRefused) {
  ferry_model_api_t short_api = kIdentityApi;
  short_api.struct_size = FERRY_STRUCT_SIZE(ferry_model_api_t, layout_free);
  EXPECT_EQ(error_of([&] { ModelBinding::create(&short_api, "short", hf_args()); }).code(),
            FERRY_STATUS_INCOMPATIBLE);
  ferry_model_api_t null_plan = kIdentityApi;
  null_plan.plan = nullptr;
  EXPECT_EQ(error_of([&] { ModelBinding::create(&null_plan, "null", hf_args()); }).code(),
            FERRY_STATUS_INCOMPATIBLE);
}

TEST(ModelBinding, DrivesAFullUpdateThroughTheEngine) {
  auto binding = ModelBinding::create(&kIdentityApi, "testidentity", hf_args());
  const auto& layout = binding->target_layout(descs_of(kCatalog));
  store::CpuWeightStore store;
  std::vector<store::TensorSpec> specs;
  for (const auto& p : layout) specs.push_back({p.name, p.dtype, p.shape});
  store.place_all("weights", store::Policy::Backup, specs);
  UpdateEngine engine(store, *binding);
  const auto w = random_weights(layout, 5);
  const auto bucket = make_bucket(layout, w, {"a", "b"}, 1, 0, 1);
  engine.begin(1, "one");
  engine.apply_bucket(bucket.bytes, bucket.encoded());
  engine.commit();
  std::vector<std::byte> b(w.at("b").size());
  store.read(*store.find("b"), 0, b);
  EXPECT_EQ(b, w.at("b"));
  EXPECT_TRUE(engine.health().ready);
}

}  // namespace
}  // namespace ferry::update
