// Tests of the dense model family's mapping logic (DenseModel), without dlopen: layouts, plans
// applied by a plain reference executor, locate round trips, and every refusal.
#include "dense_model.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace ferry::dense {
namespace {

using ::testing::HasSubstr;

enum class Family { kLlama, kQwen2, kQwen3 };

// Tiny dimensions that TP 1, 2 and 4 divide.
constexpr std::uint64_t kVocab = 16;
constexpr std::uint64_t kHidden = 8;
constexpr std::uint64_t kQRows = 8;   // 4 heads x head_dim 2
constexpr std::uint64_t kKvRows = 4;  // 2 KV heads x head_dim 2 (4 ranks split a head: the test
                                      // passes no config_json, so only divisibility is checked)
constexpr std::uint64_t kHeadDim = 2;
constexpr std::uint64_t kInter = 12;
constexpr std::uint64_t kLayers = 2;

std::string layer(std::uint64_t i, const std::string& suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

std::vector<Tensor> make_catalog(Family family, ferry_dtype_t dtype = FERRY_DTYPE_F32) {
  std::vector<Tensor> c;
  auto add = [&](const std::string& name, std::vector<std::uint64_t> shape) {
    c.push_back(Tensor{name, dtype, std::move(shape)});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (std::uint64_t i = 0; i < kLayers; ++i) {
    add(layer(i, "input_layernorm.weight"), {kHidden});
    add(layer(i, "self_attn.q_proj.weight"), {kQRows, kHidden});
    add(layer(i, "self_attn.k_proj.weight"), {kKvRows, kHidden});
    add(layer(i, "self_attn.v_proj.weight"), {kKvRows, kHidden});
    if (family == Family::kQwen2) {
      add(layer(i, "self_attn.q_proj.bias"), {kQRows});
      add(layer(i, "self_attn.k_proj.bias"), {kKvRows});
      add(layer(i, "self_attn.v_proj.bias"), {kKvRows});
    }
    if (family == Family::kQwen3) {
      add(layer(i, "self_attn.q_norm.weight"), {kHeadDim});
      add(layer(i, "self_attn.k_norm.weight"), {kHeadDim});
    }
    add(layer(i, "self_attn.o_proj.weight"), {kHidden, kQRows});
    add(layer(i, "post_attention_layernorm.weight"), {kHidden});
    add(layer(i, "mlp.gate_proj.weight"), {kInter, kHidden});
    add(layer(i, "mlp.up_proj.weight"), {kInter, kHidden});
    add(layer(i, "mlp.down_proj.weight"), {kHidden, kInter});
  }
  add("model.norm.weight", {kHidden});
  // Qwen2 here stands for the small tied-embedding checkpoints that store no lm_head.
  if (family != Family::kQwen2) add("lm_head.weight", {kVocab, kHidden});
  return c;
}

// ---- the test's own statement of the sharding rules and the engine layout --------------------

enum class Split { kNone, kRows, kCols };

Split split_of(const std::string& name) {
  auto ends = [&](const char* s) { return name.ends_with(s); };
  if (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight") ||
      ends("q_proj.bias") || ends("k_proj.bias") || ends("v_proj.bias") ||
      ends("gate_proj.weight") || ends("up_proj.weight") || name == "model.embed_tokens.weight" ||
      name == "lm_head.weight") {
    return Split::kRows;
  }
  if (ends("o_proj.weight") || ends("down_proj.weight")) return Split::kCols;
  return Split::kNone;
}

// A host tensor of floats with its shape.
struct Values {
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};

// Rank r's shard of `v` under `split`, sliced element by element.
Values shard(const Values& v, Split split, std::uint32_t r, std::uint32_t n) {
  const std::uint64_t rows = v.shape[0];
  const std::uint64_t cols = v.shape.size() > 1 ? v.shape[1] : 1;
  Values out;
  out.shape = v.shape;
  std::uint64_t row_begin = 0, row_end = rows, col_begin = 0, col_end = cols;
  if (split == Split::kRows) {
    row_begin = r * rows / n;
    row_end = (r + 1) * rows / n;
    out.shape[0] = rows / n;
  } else if (split == Split::kCols) {
    col_begin = r * cols / n;
    col_end = (r + 1) * cols / n;
    out.shape[1] = cols / n;
  }
  for (std::uint64_t i = row_begin; i < row_end; ++i) {
    for (std::uint64_t j = col_begin; j < col_end; ++j) out.data.push_back(v.data[i * cols + j]);
  }
  return out;
}

// Stacks shards along dim 0.
Values concat_rows(const std::vector<Values>& parts) {
  Values out = parts.at(0);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    out.shape[0] += parts[i].shape[0];
    out.data.insert(out.data.end(), parts[i].data.begin(), parts[i].data.end());
  }
  return out;
}

// The parameters expected for `catalog`, with their values: name -> parts (checkpoint names).
std::vector<std::pair<std::string, std::vector<std::string>>> expected_params(
    const std::vector<Tensor>& catalog, Layout layout, bool tied) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  auto has = [&](const std::string& name) {
    for (const auto& t : catalog) {
      if (t.name == name) return true;
    }
    return false;
  };
  auto single = [&](const std::string& name) {
    if (has(name)) out.push_back({name, {name}});
  };
  single("model.embed_tokens.weight");
  for (std::uint64_t i = 0; i < kLayers; ++i) {
    single(layer(i, "input_layernorm.weight"));
    if (layout == Layout::kEngine) {
      out.push_back({layer(i, "self_attn.qkv_proj.weight"),
                     {layer(i, "self_attn.q_proj.weight"), layer(i, "self_attn.k_proj.weight"),
                      layer(i, "self_attn.v_proj.weight")}});
      if (has(layer(i, "self_attn.q_proj.bias"))) {
        out.push_back({layer(i, "self_attn.qkv_proj.bias"),
                       {layer(i, "self_attn.q_proj.bias"), layer(i, "self_attn.k_proj.bias"),
                        layer(i, "self_attn.v_proj.bias")}});
      }
    } else {
      for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                            "self_attn.v_proj.weight", "self_attn.q_proj.bias",
                            "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
        single(layer(i, s));
      }
    }
    single(layer(i, "self_attn.q_norm.weight"));
    single(layer(i, "self_attn.k_norm.weight"));
    single(layer(i, "self_attn.o_proj.weight"));
    single(layer(i, "post_attention_layernorm.weight"));
    if (layout == Layout::kEngine) {
      out.push_back({layer(i, "mlp.gate_up_proj.weight"),
                     {layer(i, "mlp.gate_proj.weight"), layer(i, "mlp.up_proj.weight")}});
    } else {
      single(layer(i, "mlp.gate_proj.weight"));
      single(layer(i, "mlp.up_proj.weight"));
    }
    single(layer(i, "mlp.down_proj.weight"));
  }
  single("model.norm.weight");
  if (!tied) single("lm_head.weight");
  return out;
}

// ---- a plain reference executor ---------------------------------------------------------------

struct Buffer {
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<unsigned char> bytes;
  std::vector<int> writes;  // per element
};

Buffer make_buffer(const Tensor& t) {
  Buffer b;
  b.dtype = t.dtype;
  const std::uint64_t n = *element_count(t.shape);
  b.bytes.assign(n * dtype_size(t.dtype), 0);
  b.writes.assign(n, 0);
  return b;
}

// Applies ops element by element; src[i] is entry i of the planned bucket (float data).
void execute(const std::vector<ferry_plan_op_t>& ops, const std::vector<const Values*>& src,
             std::vector<Buffer>& params) {
  for (const ferry_plan_op_t& op : ops) {
    ASSERT_LT(op.src_tensor, src.size());
    ASSERT_LT(op.dst_param, params.size());
    const Values& s = *src[op.src_tensor];
    Buffer& d = params[op.dst_param];
    ASSERT_EQ(op.src_dtype, FERRY_DTYPE_F32);
    ASSERT_EQ(op.dst_dtype, d.dtype);
    for (std::uint64_t r = 0; r < op.rows; ++r) {
      for (std::uint64_t c = 0; c < op.cols; ++c) {
        const std::uint64_t si = op.src_offset + r * op.src_row_stride + c;
        const std::uint64_t di = op.dst_offset + r * op.dst_row_stride + c;
        ASSERT_LT(si, s.data.size());
        ASSERT_LT(di, d.writes.size());
        if (op.transform == FERRY_TRANSFORM_COPY) {
          ASSERT_EQ(d.dtype, FERRY_DTYPE_F32);
          std::memcpy(&d.bytes[di * 4], &s.data[si], 4);
        } else {
          ASSERT_EQ(op.transform, FERRY_TRANSFORM_CAST);
          ASSERT_EQ(d.dtype, FERRY_DTYPE_F64);
          const double v = s.data[si];
          std::memcpy(&d.bytes[di * 8], &v, 8);
        }
        ++d.writes[di];
      }
    }
  }
}

double element(const Buffer& b, std::uint64_t i) {
  if (b.dtype == FERRY_DTYPE_F64) {
    double v;
    std::memcpy(&v, &b.bytes[i * 8], 8);
    return v;
  }
  float v;
  std::memcpy(&v, &b.bytes[i * 4], 4);
  return v;
}

std::map<std::string, Values> random_values(const std::vector<Tensor>& catalog, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::map<std::string, Values> out;
  for (const Tensor& t : catalog) {
    Values v;
    v.shape = t.shape;
    v.data.resize(*element_count(t.shape));
    for (float& x : v.data) x = dist(gen);
    out[t.name] = std::move(v);
  }
  return out;
}

ferry_status_code_t code_of(const std::function<void()>& body, std::string* message = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.code();
  }
  return FERRY_STATUS_OK;
}

DenseModel make_model(Layout layout, std::uint32_t rank, std::uint32_t size,
                      std::optional<ferry_dtype_t> dtype = std::nullopt, bool tie = false) {
  ModelConfig config;
  config.layout = layout;
  config.tp_rank = rank;
  config.tp_size = size;
  config.dtype = dtype;
  config.tie_word_embeddings = tie;
  return DenseModel(config);
}

// ---- layouts and plans over families x layouts x TP sizes ------------------------------------

using Case = std::tuple<Family, Layout, std::uint32_t, bool /*cast to f64*/>;

class DenseLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(DenseLayoutTest, PlansWriteEveryParameterElementOnceWithTheExpectedShard) {
  const auto [family, layout, tp_size, cast] = GetParam();
  const std::vector<Tensor> catalog = make_catalog(family);
  const std::map<std::string, Values> values = random_values(catalog, 1234 + tp_size);
  const bool tied = family == Family::kQwen2;
  const auto expected = expected_params(catalog, layout, tied);

  for (std::uint32_t rank = 0; rank < tp_size; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(tp_size));
    DenseModel model = make_model(layout, rank, tp_size,
                                  cast ? std::optional(FERRY_DTYPE_F64) : std::nullopt);
    const std::vector<Tensor> params = model.target_layout(catalog);

    // Names, order, shapes and dtypes match the test's own statement of the layout.
    ASSERT_EQ(params.size(), expected.size());
    std::vector<Values> expected_values;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      std::vector<Values> parts;
      for (const std::string& part : expected[i].second) {
        parts.push_back(shard(values.at(part), split_of(part), rank, tp_size));
      }
      expected_values.push_back(concat_rows(parts));
      EXPECT_EQ(params[i].name, expected[i].first);
      EXPECT_EQ(params[i].shape, expected_values.back().shape) << params[i].name;
      EXPECT_EQ(params[i].dtype, cast ? FERRY_DTYPE_F64 : FERRY_DTYPE_F32) << params[i].name;
    }

    // Apply the catalog as buckets of five entries, the last bucket in reverse order.
    std::vector<Buffer> buffers;
    for (const Tensor& p : params) buffers.push_back(make_buffer(p));
    for (std::size_t begin = 0; begin < catalog.size(); begin += 5) {
      std::vector<Tensor> bucket(catalog.begin() + begin,
                                 catalog.begin() + std::min(begin + 5, catalog.size()));
      if (begin + 5 >= catalog.size()) std::reverse(bucket.begin(), bucket.end());
      std::vector<const Values*> src;
      for (const Tensor& t : bucket) src.push_back(&values.at(t.name));
      const std::vector<ferry_plan_op_t> ops = model.plan(bucket);
      for (const ferry_plan_op_t& op : ops) {
        EXPECT_EQ(op.transform, cast ? FERRY_TRANSFORM_CAST : FERRY_TRANSFORM_COPY);
      }
      execute(ops, src, buffers);
      if (::testing::Test::HasFatalFailure()) return;
    }

    for (std::size_t p = 0; p < params.size(); ++p) {
      const Values& want = expected_values[p];
      ASSERT_EQ(buffers[p].writes.size(), want.data.size());
      for (std::size_t i = 0; i < want.data.size(); ++i) {
        ASSERT_EQ(buffers[p].writes[i], 1) << params[p].name << " element " << i;
        ASSERT_EQ(element(buffers[p], i), static_cast<double>(want.data[i]))
            << params[p].name << " element " << i;
      }
    }

    // locate: reading the region back gives this rank's shard of each checkpoint tensor.
    for (const Tensor& t : catalog) {
      if (t.name == "lm_head.weight" && tied) continue;
      const ferry_plan_op_t op = model.locate(Tensor{t.name, FERRY_DTYPE_INVALID, {}});
      const Values want = shard(values.at(t.name), split_of(t.name), rank, tp_size);
      ASSERT_EQ(op.rows * op.cols, want.data.size()) << t.name;
      EXPECT_EQ(op.src_offset, 0u);
      EXPECT_EQ(op.src_dtype, FERRY_DTYPE_F32);
      const Buffer& b = buffers.at(op.dst_param);
      std::size_t k = 0;
      for (std::uint64_t r = 0; r < op.rows; ++r) {
        for (std::uint64_t c = 0; c < op.cols; ++c, ++k) {
          ASSERT_EQ(element(b, op.dst_offset + r * op.dst_row_stride + c),
                    static_cast<double>(want.data[k]))
              << t.name << " element " << k;
        }
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [family, layout, tp, cast] = info.param;
  const char* f = family == Family::kLlama ? "Llama" : family == Family::kQwen2 ? "Qwen2" : "Qwen3";
  return std::string(f) + (layout == Layout::kEngine ? "Engine" : "Hf") + "Tp" +
         std::to_string(tp) + (cast ? "CastF64" : "");
}

INSTANTIATE_TEST_SUITE_P(FamiliesLayoutsTp, DenseLayoutTest,
                         ::testing::Combine(::testing::Values(Family::kLlama, Family::kQwen2,
                                                              Family::kQwen3),
                                            ::testing::Values(Layout::kEngine, Layout::kHf),
                                            ::testing::Values(1u, 2u, 4u),
                                            ::testing::Values(false, true)),
                         case_name);

// ---- specific behaviours ----------------------------------------------------------------------

TEST(DenseModel, HfLayoutAtTp1IsTheCheckpointItself) {
  const std::vector<Tensor> catalog = make_catalog(Family::kQwen3);
  DenseModel model = make_model(Layout::kHf, 0, 1);
  const std::vector<Tensor> params = model.target_layout(catalog);
  ASSERT_EQ(params.size(), catalog.size());
  std::map<std::string, std::vector<std::uint64_t>> shapes;
  for (const Tensor& p : params) shapes[p.name] = p.shape;
  for (const Tensor& t : catalog) EXPECT_EQ(shapes.at(t.name), t.shape) << t.name;
}

TEST(DenseModel, EngineQkvShardOfRankIsQThenKThenVRows) {
  DenseModel model = make_model(Layout::kEngine, 1, 2);
  const std::vector<Tensor> params = model.target_layout(make_catalog(Family::kLlama));
  const std::vector<Tensor> entries = {
      Tensor{layer(0, "self_attn.v_proj.weight"), FERRY_DTYPE_F32, {kKvRows, kHidden}}};
  const std::vector<ferry_plan_op_t> ops = model.plan(entries);
  ASSERT_EQ(ops.size(), 1u);
  // v rows [2, 4) of rank 1 follow q's 4 and k's 2 rows in the fused parameter.
  EXPECT_EQ(params[ops[0].dst_param].name, layer(0, "self_attn.qkv_proj.weight"));
  EXPECT_EQ(ops[0].src_offset, (kKvRows / 2) * kHidden);
  EXPECT_EQ(ops[0].dst_offset, (kQRows / 2 + kKvRows / 2) * kHidden);
  EXPECT_EQ(ops[0].rows * ops[0].cols, (kKvRows / 2) * kHidden);
}

TEST(DenseModel, TiedConfigDropsLmHeadAndLocatesItInTheEmbedding) {
  const std::vector<Tensor> catalog = make_catalog(Family::kQwen3);  // has lm_head.weight
  DenseModel model = make_model(Layout::kEngine, 0, 2, std::nullopt, /*tie=*/true);
  const std::vector<Tensor> params = model.target_layout(catalog);
  for (const Tensor& p : params) EXPECT_NE(p.name, "lm_head.weight");
  const std::vector<Tensor> entries = {Tensor{"lm_head.weight", FERRY_DTYPE_F32, {kVocab, kHidden}}};
  EXPECT_TRUE(model.plan(entries).empty());
  const ferry_plan_op_t op = model.locate(Tensor{"lm_head.weight", FERRY_DTYPE_INVALID, {}});
  EXPECT_EQ(params[op.dst_param].name, "model.embed_tokens.weight");
}

TEST(DenseModel, RotaryInvFreqIsAcceptedAndNeedsNoOperation) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  catalog.push_back(Tensor{layer(1, "self_attn.rotary_emb.inv_freq"), FERRY_DTYPE_F32, {4}});
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  const std::size_t num_params = model.target_layout(catalog).size();
  EXPECT_EQ(num_params, expected_params(catalog, Layout::kEngine, false).size());
  EXPECT_TRUE(model.plan({catalog.back()}).empty());
  EXPECT_EQ(code_of([&] { model.locate(catalog.back()); }), FERRY_STATUS_NOT_FOUND);
}

TEST(DenseModel, EntryDtypeOtherThanTheParameterIsPlannedAsCast) {
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  model.target_layout(make_catalog(Family::kLlama, FERRY_DTYPE_BF16));
  const auto ops = model.plan({Tensor{"model.norm.weight", FERRY_DTYPE_F32, {kHidden}}});
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].transform, FERRY_TRANSFORM_CAST);
  EXPECT_EQ(ops[0].src_dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(ops[0].dst_dtype, FERRY_DTYPE_BF16);
}

// ---- refusals ---------------------------------------------------------------------------------

TEST(DenseModelErrors, UnknownTensorsAreListedByName) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  catalog.push_back(Tensor{layer(0, "mlp.experts.0.w1.weight"), FERRY_DTYPE_F32, {4, 4}});
  catalog.push_back(Tensor{"visual.proj.weight", FERRY_DTYPE_F32, {4}});
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr(layer(0, "mlp.experts.0.w1.weight")));
  EXPECT_THAT(message, HasSubstr("visual.proj.weight"));
}

TEST(DenseModelErrors, MissingTensorsAreListedByName) {
  std::vector<Tensor> catalog = make_catalog(Family::kQwen2);
  std::erase_if(catalog, [](const Tensor& t) {
    return t.name == layer(1, "self_attn.k_proj.weight") || t.name == "model.norm.weight" ||
           t.name == layer(0, "self_attn.v_proj.bias");
  });
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(message, HasSubstr(layer(1, "self_attn.k_proj.weight")));
  EXPECT_THAT(message, HasSubstr(layer(0, "self_attn.v_proj.bias")));
  EXPECT_THAT(message, HasSubstr("model.norm.weight"));
}

TEST(DenseModelErrors, LayerMissingFromTheMiddleIsReported) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  std::erase_if(catalog, [](const Tensor& t) { return t.name.starts_with("model.layers.0."); });
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(message, HasSubstr("model.layers.0.*"));
}

TEST(DenseModelErrors, MisShapedTensorsAreListedWithExpectedAndGot) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  for (Tensor& t : catalog) {
    if (t.name == layer(1, "mlp.up_proj.weight")) t.shape = {10, kHidden};
    if (t.name == layer(0, "self_attn.q_proj.weight")) t.shape = {kQRows, 7};
  }
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr(layer(1, "mlp.up_proj.weight") + " (expected [12, 8], got [10, 8])"));
  EXPECT_THAT(message, HasSubstr(layer(0, "self_attn.q_proj.weight") + " (expected [*, 8], got [8, 7])"));
}

TEST(DenseModelErrors, IndivisibleDimensionNamesTensorDimAndTpSize) {
  DenseModel model = make_model(Layout::kEngine, 0, 3);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(make_catalog(Family::kLlama)); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("tp_size 3"));
  EXPECT_THAT(message, HasSubstr("model.embed_tokens.weight dim 0 (16)"));
  EXPECT_THAT(message, HasSubstr(layer(0, "self_attn.o_proj.weight") + " dim 1 (8)"));
}

TEST(DenseModelErrors, FusedPartsWithDifferentDtypesAreRefusedUnlessCast) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  for (Tensor& t : catalog) {
    if (t.name == layer(0, "mlp.up_proj.weight")) t.dtype = FERRY_DTYPE_BF16;
  }
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr(layer(0, "mlp.up_proj.weight")));
  DenseModel cast = make_model(Layout::kEngine, 0, 1, FERRY_DTYPE_BF16);
  EXPECT_EQ(code_of([&] { cast.target_layout(catalog); }), FERRY_STATUS_OK);
}

TEST(DenseModelErrors, DuplicateCatalogNameIsRefused) {
  std::vector<Tensor> catalog = make_catalog(Family::kLlama);
  catalog.push_back(catalog[3]);
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(catalog); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr(catalog[3].name + " (listed twice)"));
}

TEST(DenseModelErrors, PlanRefusesUnknownMisShapedAndEarlyEntries) {
  DenseModel model = make_model(Layout::kEngine, 0, 1);
  const std::vector<Tensor> norm = {Tensor{"model.norm.weight", FERRY_DTYPE_F32, {kHidden}}};
  EXPECT_EQ(code_of([&] { model.plan(norm); }), FERRY_STATUS_FAILED_PRECONDITION);
  model.target_layout(make_catalog(Family::kLlama));
  std::string message;
  EXPECT_EQ(code_of([&] { model.plan({Tensor{"model.nope.weight", FERRY_DTYPE_F32, {2}}}); },
                    &message),
            FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(message, HasSubstr("model.nope.weight"));
  EXPECT_EQ(code_of([&] { model.plan({Tensor{"model.norm.weight", FERRY_DTYPE_F32, {4}}}); },
                    &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("[4]"));
  EXPECT_EQ(code_of([&] { model.plan({norm[0], norm[0]}); }), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(code_of([&] { model.locate(Tensor{"model.nope", FERRY_DTYPE_F32, {}}); }),
            FERRY_STATUS_NOT_FOUND);
}

TEST(DenseModelErrors, BadCreateArgumentsAreInvalid) {
  std::string message;
  EXPECT_EQ(code_of([&] { make_config("megatron", 0, 1, {}, nullptr); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("megatron"));
  EXPECT_EQ(code_of([&] { make_config("engine", 0, 1, {{"fuse", "yes"}}, nullptr); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("'fuse'"));
  EXPECT_EQ(code_of([&] { make_config("engine", 0, 1, {{"dtype", "i8"}}, nullptr); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("i8"));
  EXPECT_EQ(make_config("engine", 0, 1, {{"dtype", "bf16"}}, nullptr).dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(make_config("hf", 0, 1, {{"dtype", "float32"}}, nullptr).dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(code_of([&] { make_config("engine", 0, 1, {}, "{not json"); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("config_json"));
  EXPECT_EQ(code_of([&] { DenseModel(make_config("engine", 0, 0, {}, nullptr)); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("tp_size"));
  EXPECT_EQ(code_of([&] { DenseModel(make_config("engine", 2, 2, {}, nullptr)); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("tp_rank 2"));
  const char* gqa = R"({"num_attention_heads": 4, "num_key_value_heads": 2})";
  EXPECT_EQ(code_of([&] { DenseModel(make_config("engine", 0, 4, {}, gqa)); }, &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("num_key_value_heads 2 is below tp_size 4"));
  EXPECT_EQ(code_of([&] { DenseModel(make_config("engine", 0, 2, {}, gqa)); }), FERRY_STATUS_OK);
}

TEST(DenseModel, ConfigJsonTieWordEmbeddingsAndLayerCountAreRead) {
  const ModelConfig config = make_config(
      "engine", 0, 1, {}, R"({"tie_word_embeddings": true, "num_hidden_layers": 3})");
  EXPECT_TRUE(config.tie_word_embeddings);
  DenseModel model(config);
  std::string message;
  EXPECT_EQ(code_of([&] { model.target_layout(make_catalog(Family::kLlama)); }, &message),
            FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(message, HasSubstr("model.layers.2.*"));
}

}  // namespace
}  // namespace ferry::dense
