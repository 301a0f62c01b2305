// Tests of the MoE mapping logic (ferry::moe::MoeModel) directly: stacked expert layouts for
// Qwen3-MoE, Qwen2-MoE (shared expert and its gate) and DeepSeek-V3 (dense first layers, shared
// experts, correction bias, MLA attention); EP and TP blocks; hf layout; errors.
#include "moe_model.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace {

using ferry::moe::MoeModel;
using ferry::moe::Tensor;
using ::testing::HasSubstr;

constexpr std::uint64_t kH = 8, kVocab = 16, kI = 4, kQ = 8, kKv = 4;

void add(std::vector<Tensor>& c, std::string name, std::vector<std::uint64_t> shape,
         ferry_dtype_t dtype = FERRY_DTYPE_BF16) {
  c.push_back(Tensor{std::move(name), dtype, std::move(shape)});
}

// Standard attention (Qwen) of layer l.
void attention(std::vector<Tensor>& c, int l, bool qk_norm) {
  const std::string p = fmt::format("model.layers.{}.", l);
  add(c, p + "input_layernorm.weight", {kH});
  add(c, p + "self_attn.q_proj.weight", {kQ, kH});
  add(c, p + "self_attn.k_proj.weight", {kKv, kH});
  add(c, p + "self_attn.v_proj.weight", {kKv, kH});
  if (qk_norm) {
    add(c, p + "self_attn.q_norm.weight", {2});
    add(c, p + "self_attn.k_norm.weight", {2});
  }
  add(c, p + "self_attn.o_proj.weight", {kH, kQ});
  add(c, p + "post_attention_layernorm.weight", {kH});
}

void experts(std::vector<Tensor>& c, int l, std::uint64_t e_count, std::uint64_t skip = ~0ull) {
  const std::string p = fmt::format("model.layers.{}.mlp.", l);
  add(c, p + "gate.weight", {e_count, kH});
  for (std::uint64_t e = 0; e < e_count; ++e) {
    if (e == skip) continue;
    add(c, fmt::format("{}experts.{}.gate_proj.weight", p, e), {kI, kH});
    add(c, fmt::format("{}experts.{}.up_proj.weight", p, e), {kI, kH});
    add(c, fmt::format("{}experts.{}.down_proj.weight", p, e), {kH, kI});
  }
}

std::vector<Tensor> qwen3_moe(int layers, std::uint64_t e_count) {
  std::vector<Tensor> c;
  add(c, "model.embed_tokens.weight", {kVocab, kH});
  for (int l = 0; l < layers; ++l) {
    attention(c, l, true);
    experts(c, l, e_count);
  }
  add(c, "model.norm.weight", {kH});
  add(c, "lm_head.weight", {kVocab, kH});
  return c;
}

MoeModel make(std::uint32_t tp_rank, std::uint32_t tp_size, std::uint32_t ep_rank,
              std::uint32_t ep_size, const char* layout = "engine", const char* config = nullptr) {
  return MoeModel(ferry::moe::make_config(layout, tp_rank, tp_size, ep_rank, ep_size, {}, config));
}

std::map<std::string, Tensor> by_name(const std::vector<Tensor>& params) {
  std::map<std::string, Tensor> out;
  for (const auto& p : params) out[p.name] = p;
  return out;
}

std::uint32_t index_of(const std::vector<Tensor>& params, const std::string& name) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return static_cast<std::uint32_t>(i);
  }
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

template <typename Body>
ferry::Error error_of(Body&& body) {
  try {
    body();
  } catch (const ferry::Error& e) {
    return e;
  }
  return ferry::Error(FERRY_STATUS_OK, "");
}

TEST(MoeLayout, Qwen3MoeStacksExpertsAndKeepsDenseParts) {
  MoeModel m = make(0, 1, 0, 1);
  const auto params = m.target_layout(qwen3_moe(2, 4));
  const auto p = by_name(params);
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.w13_weight").shape,
            (std::vector<std::uint64_t>{4, 2 * kI, kH}));
  EXPECT_EQ(p.at("model.layers.1.mlp.experts.w2_weight").shape,
            (std::vector<std::uint64_t>{4, kH, kI}));
  EXPECT_EQ(p.at("model.layers.0.mlp.gate.weight").shape, (std::vector<std::uint64_t>{4, kH}));
  EXPECT_EQ(p.at("model.layers.0.self_attn.qkv_proj.weight").shape,
            (std::vector<std::uint64_t>{kQ + 2 * kKv, kH}));
  EXPECT_EQ(p.count("model.layers.0.mlp.gate_up_proj.weight"), 0u);  // no dense MLP
  EXPECT_EQ(p.count("model.layers.0.mlp.down_proj.weight"), 0u);
  // Order: embedding first, layer 0 before layer 1, lm_head last.
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_LT(index_of(params, "model.layers.0.mlp.experts.w2_weight"),
            index_of(params, "model.layers.1.input_layernorm.weight"));
  EXPECT_EQ(params.size(), 1u + 2 * (6 + 3) + 2);  // norms, qkv, q/k norms, o; router, w13, w2
}

TEST(MoePlan, ExpertsLandInTheirSlotGateThenUp) {
  MoeModel m = make(0, 1, 0, 1);
  const auto params = m.target_layout(qwen3_moe(1, 4));
  const std::uint32_t w13 = index_of(params, "model.layers.0.mlp.experts.w13_weight");
  const std::uint32_t w2 = index_of(params, "model.layers.0.mlp.experts.w2_weight");
  const auto ops = m.plan({{"model.layers.0.mlp.experts.2.up_proj.weight", FERRY_DTYPE_BF16, {kI, kH}},
                           {"model.layers.0.mlp.experts.3.down_proj.weight", FERRY_DTYPE_F32, {kH, kI}},
                           {"model.layers.0.self_attn.k_proj.weight", FERRY_DTYPE_BF16, {kKv, kH}}});
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].src_tensor, 0u);
  EXPECT_EQ(ops[0].dst_param, w13);
  EXPECT_EQ(ops[0].dst_offset, 2 * (2 * kI * kH) + kI * kH);
  EXPECT_EQ(ops[0].cols, kI * kH);
  EXPECT_EQ(ops[1].dst_param, w2);
  EXPECT_EQ(ops[1].dst_offset, 3 * kH * kI);
  EXPECT_EQ(ops[1].transform, FERRY_TRANSFORM_CAST);  // f32 arrived for a bf16 parameter
  EXPECT_EQ(ops[2].src_tensor, 2u);
  EXPECT_EQ(ops[2].dst_param, index_of(params, "model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_EQ(ops[2].dst_offset, kQ * kH);
}

TEST(MoePlan, ExpertParallelAndTensorParallelCombine) {
  // EP 2 x TP 2, rank (ep 1, tp 1): experts 2 and 3, the second half of I.
  MoeModel m = make(1, 2, 1, 2);
  const auto params = m.target_layout(qwen3_moe(1, 4));
  const auto p = by_name(params);
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.w13_weight").shape,
            (std::vector<std::uint64_t>{2, kI, kH}));
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.w2_weight").shape,
            (std::vector<std::uint64_t>{2, kH, kI / 2}));
  const auto ops = m.plan({{"model.layers.0.mlp.experts.1.gate_proj.weight", FERRY_DTYPE_BF16, {kI, kH}},
                           {"model.layers.0.mlp.experts.3.gate_proj.weight", FERRY_DTYPE_BF16, {kI, kH}},
                           {"model.layers.0.mlp.experts.3.up_proj.weight", FERRY_DTYPE_BF16, {kI, kH}},
                           {"model.layers.0.mlp.experts.2.down_proj.weight", FERRY_DTYPE_BF16, {kH, kI}}});
  ASSERT_EQ(ops.size(), 3u);  // expert 1 belongs to ep rank 0
  const std::uint64_t half = kI / 2;
  EXPECT_EQ(ops[0].src_tensor, 1u);
  EXPECT_EQ(ops[0].src_offset, half * kH);           // tp rank 1: rows [2, 4) of gate
  EXPECT_EQ(ops[0].dst_offset, 1 * (2 * half * kH));  // local slot 1
  EXPECT_EQ(ops[1].dst_offset, 1 * (2 * half * kH) + half * kH);
  EXPECT_EQ(ops[2].rows, kH);                          // down: columns [2, 4) of each row
  EXPECT_EQ(ops[2].cols, half);
  EXPECT_EQ(ops[2].src_offset, half);
  EXPECT_EQ(ops[2].src_row_stride, kI);
  EXPECT_EQ(ops[2].dst_offset, 0u);  // local slot 0
  const auto err = error_of([&] {
    m.locate({"model.layers.0.mlp.experts.1.gate_proj.weight", FERRY_DTYPE_INVALID, {}});
  });
  EXPECT_EQ(err.code(), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(err.what(), HasSubstr("ep rank 0"));
  const auto op = m.locate({"model.layers.0.mlp.experts.3.up_proj.weight", FERRY_DTYPE_INVALID, {}});
  EXPECT_EQ(op.dst_offset, ops[1].dst_offset);
  EXPECT_EQ(op.cols, half * kH);
}

TEST(MoeLayout, HfLayoutKeepsThisRanksExpertsUnderTheirNames) {
  MoeModel m = make(0, 1, 1, 2, "hf");
  const auto p = by_name(m.target_layout(qwen3_moe(1, 4)));
  EXPECT_EQ(p.count("model.layers.0.mlp.experts.w13_weight"), 0u);
  EXPECT_EQ(p.count("model.layers.0.mlp.experts.1.gate_proj.weight"), 0u);
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.2.gate_proj.weight").shape,
            (std::vector<std::uint64_t>{kI, kH}));
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.3.down_proj.weight").shape,
            (std::vector<std::uint64_t>{kH, kI}));
  EXPECT_EQ(p.count("model.layers.0.self_attn.q_proj.weight"), 1u);
}

TEST(MoeLayout, Qwen2MoeSharedExpertIsFusedAndShardedItsGateReplicated) {
  std::vector<Tensor> c;
  add(c, "model.embed_tokens.weight", {kVocab, kH});
  attention(c, 0, false);
  experts(c, 0, 4);
  add(c, "model.layers.0.mlp.shared_expert.gate_proj.weight", {16, kH});
  add(c, "model.layers.0.mlp.shared_expert.up_proj.weight", {16, kH});
  add(c, "model.layers.0.mlp.shared_expert.down_proj.weight", {kH, 16});
  add(c, "model.layers.0.mlp.shared_expert_gate.weight", {1, kH});
  add(c, "model.norm.weight", {kH});
  MoeModel m = make(1, 2, 0, 1);
  const auto params = m.target_layout(c);
  const auto p = by_name(params);
  EXPECT_EQ(p.at("model.layers.0.mlp.shared_expert.gate_up_proj.weight").shape,
            (std::vector<std::uint64_t>{16, kH}));
  EXPECT_EQ(p.at("model.layers.0.mlp.shared_expert.down_proj.weight").shape,
            (std::vector<std::uint64_t>{kH, 8}));
  EXPECT_EQ(p.at("model.layers.0.mlp.shared_expert_gate.weight").shape,
            (std::vector<std::uint64_t>{1, kH}));
  const auto ops = m.plan({{"model.layers.0.mlp.shared_expert.up_proj.weight", FERRY_DTYPE_BF16, {16, kH}}});
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].src_offset, 8 * kH);  // tp rank 1's rows
  EXPECT_EQ(ops[0].dst_offset, 8 * kH);  // after this rank's gate rows
}

TEST(MoeLayout, DeepSeekV3DenseFirstLayersMlaSharedExpertsAndBias) {
  std::vector<Tensor> c;
  add(c, "model.embed_tokens.weight", {kVocab, kH});
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(c, p + "input_layernorm.weight", {kH});
    add(c, p + "post_attention_layernorm.weight", {kH});
    add(c, p + "self_attn.q_a_proj.weight", {6, kH});
    add(c, p + "self_attn.q_a_layernorm.weight", {6});
    add(c, p + "self_attn.q_b_proj.weight", {12, 6});
    add(c, p + "self_attn.kv_a_proj_with_mqa.weight", {5, kH});
    add(c, p + "self_attn.kv_a_layernorm.weight", {4});
    add(c, p + "self_attn.kv_b_proj.weight", {16, 4});
    add(c, p + "self_attn.o_proj.weight", {kH, 8});
  }
  add(c, "model.layers.0.mlp.gate_proj.weight", {16, kH});  // first_k_dense_replace = 1
  add(c, "model.layers.0.mlp.up_proj.weight", {16, kH});
  add(c, "model.layers.0.mlp.down_proj.weight", {kH, 16});
  experts(c, 1, 8);
  add(c, "model.layers.1.mlp.gate.e_score_correction_bias", {8}, FERRY_DTYPE_F32);
  add(c, "model.layers.1.mlp.shared_experts.gate_proj.weight", {kI, kH});
  add(c, "model.layers.1.mlp.shared_experts.up_proj.weight", {kI, kH});
  add(c, "model.layers.1.mlp.shared_experts.down_proj.weight", {kH, kI});
  add(c, "model.layers.2.embed_tokens.weight", {kVocab, kH});  // an MTP layer: not loaded
  add(c, "model.norm.weight", {kH});
  add(c, "lm_head.weight", {kVocab, kH});
  const char* config =
      R"({"n_routed_experts": 8, "num_hidden_layers": 2, "num_nextn_predict_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2})";
  MoeModel m = make(0, 2, 1, 4, "engine", config);
  const auto p = by_name(m.target_layout(c));
  EXPECT_EQ(p.at("model.layers.0.mlp.gate_up_proj.weight").shape,
            (std::vector<std::uint64_t>{16, kH}));
  EXPECT_EQ(p.at("model.layers.1.mlp.experts.w13_weight").shape,
            (std::vector<std::uint64_t>{2, kI, kH}));
  EXPECT_EQ(p.at("model.layers.1.mlp.gate.e_score_correction_bias").shape,
            (std::vector<std::uint64_t>{8}));
  EXPECT_EQ(p.at("model.layers.1.mlp.shared_experts.gate_up_proj.weight").shape,
            (std::vector<std::uint64_t>{kI, kH}));
  EXPECT_EQ(p.at("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight").shape,
            (std::vector<std::uint64_t>{11, kH}));
  EXPECT_EQ(p.at("model.layers.1.self_attn.q_b_proj.weight").shape,
            (std::vector<std::uint64_t>{6, 6}));
  EXPECT_EQ(p.at("model.layers.1.self_attn.o_proj.weight").shape,
            (std::vector<std::uint64_t>{kH, 4}));
  EXPECT_EQ(p.count("model.layers.0.self_attn.qkv_proj.weight"), 0u);  // no stand-in leaks
  EXPECT_EQ(p.count("model.layers.1.mlp.gate_up_proj.weight"), 0u);
  const auto ops = m.plan({{"model.layers.2.embed_tokens.weight", FERRY_DTYPE_BF16, {kVocab, kH}},
                           {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight", FERRY_DTYPE_BF16, {5, kH}}});
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].dst_offset, 6 * kH);  // after q_a_proj's rows
}

TEST(MoeErrors, MissingExpertsAreListedByIndex) {
  std::vector<Tensor> c;
  add(c, "model.embed_tokens.weight", {kVocab, kH});
  attention(c, 0, false);
  experts(c, 0, 8, 5);
  add(c, "model.norm.weight", {kH});
  c.erase(std::remove_if(c.begin(), c.end(),
                         [](const Tensor& t) {
                           return t.name == "model.layers.0.mlp.experts.2.down_proj.weight";
                         }),
          c.end());
  MoeModel m = make(0, 1, 0, 1);
  const auto err = error_of([&] { m.target_layout(c); });
  EXPECT_EQ(err.code(), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(err.what(), HasSubstr("2 of 8 experts missing, by index: 2 (down_proj), 5"));
}

TEST(MoeErrors, SizesExpertParallelismCannotDivideAreRefused) {
  MoeModel m = make(0, 1, 0, 3);
  const auto err = error_of([&] { m.target_layout(qwen3_moe(1, 4)); });
  EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(err.what(), HasSubstr("4 experts are not divisible by ep_size 3"));
  MoeModel t = make(0, 3, 0, 1);
  EXPECT_EQ(error_of([&] { t.target_layout(qwen3_moe(1, 4)); }).code(),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(error_of([] { make(2, 2, 0, 1); }).code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(error_of([] { make(0, 1, 2, 2); }).code(), FERRY_STATUS_INVALID_ARGUMENT);
}

TEST(MoeErrors, MisShapedExpertIsNamed) {
  auto c = qwen3_moe(1, 4);
  for (auto& t : c) {
    if (t.name == "model.layers.0.mlp.experts.1.up_proj.weight") t.shape = {kI + 1, kH};
  }
  MoeModel m = make(0, 1, 0, 1);
  const auto err = error_of([&] { m.target_layout(c); });
  EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(err.what(), HasSubstr("model.layers.0.mlp.experts.1.up_proj.weight (expected [4, 8]"));
}

TEST(MoeErrors, UnknownNamesGoToTheDenseModelAndAreRefused) {
  auto c = qwen3_moe(1, 4);
  add(c, "model.layers.0.mlp.experts.0.extra.weight", {kH});
  MoeModel m = make(0, 1, 0, 1);
  const auto err = error_of([&] { m.target_layout(c); });
  EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(err.what(), HasSubstr("model.layers.0.mlp.experts.0.extra.weight"));
}

}  // namespace
