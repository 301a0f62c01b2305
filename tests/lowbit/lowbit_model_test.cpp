// Tests of the low-bit model logic (ferry::lowbit::LowbitModel) directly: which parameters turn
// FP8 with which scale parameters, how plan ops are rewritten to the scale-addressing convention
// (whole matrix rows, dst_row_stride = K, scale_param), options, and the 128-boundary errors.
#include "lowbit_model.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace {

using ferry::lowbit::LowbitModel;
using ferry::lowbit::Tensor;
using ::testing::HasSubstr;

constexpr std::uint64_t kH = 256, kVocab = 64, kQ = 256, kKv = 256;

void add(std::vector<Tensor>& c, std::string name, std::vector<std::uint64_t> shape) {
  c.push_back(Tensor{std::move(name), FERRY_DTYPE_BF16, std::move(shape)});
}

// One Qwen3-MoE layer (head_dim 128: 2 q heads, 2 kv heads) with `e` experts of size `inter`.
std::vector<Tensor> catalog(std::uint64_t e, std::uint64_t inter, std::uint64_t kv = kKv) {
  std::vector<Tensor> c;
  add(c, "model.embed_tokens.weight", {kVocab, kH});
  const std::string p = "model.layers.0.";
  add(c, p + "input_layernorm.weight", {kH});
  add(c, p + "self_attn.q_proj.weight", {kQ, kH});
  add(c, p + "self_attn.k_proj.weight", {kv, kH});
  add(c, p + "self_attn.v_proj.weight", {kv, kH});
  add(c, p + "self_attn.q_norm.weight", {128});
  add(c, p + "self_attn.k_norm.weight", {128});
  add(c, p + "self_attn.o_proj.weight", {kH, kQ});
  add(c, p + "post_attention_layernorm.weight", {kH});
  add(c, p + "mlp.gate.weight", {e, kH});
  for (std::uint64_t i = 0; i < e; ++i) {
    add(c, fmt::format("{}mlp.experts.{}.gate_proj.weight", p, i), {inter, kH});
    add(c, fmt::format("{}mlp.experts.{}.up_proj.weight", p, i), {inter, kH});
    add(c, fmt::format("{}mlp.experts.{}.down_proj.weight", p, i), {kH, inter});
  }
  add(c, "model.norm.weight", {kH});
  add(c, "lm_head.weight", {kVocab, kH});
  return c;
}

LowbitModel make(std::uint32_t tp_rank, std::uint32_t tp_size, std::uint32_t ep_rank,
                 std::uint32_t ep_size, ferry::lowbit::Options options = {},
                 const char* layout = "engine") {
  return LowbitModel(ferry::lowbit::make_config(layout, tp_rank, tp_size, ep_rank, ep_size,
                                                options, nullptr));
}

std::map<std::string, std::pair<std::size_t, Tensor>> by_name(const std::vector<Tensor>& params) {
  std::map<std::string, std::pair<std::size_t, Tensor>> out;
  for (std::size_t i = 0; i < params.size(); ++i) out[params[i].name] = {i, params[i]};
  return out;
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

TEST(LowbitLayout, LinearWeightsTurnFp8WithScalesAfterThem) {
  LowbitModel m = make(0, 1, 0, 1);
  const auto p = by_name(m.target_layout(catalog(4, 384)));
  const auto& w13 = p.at("model.layers.0.mlp.experts.w13_weight");
  EXPECT_EQ(w13.second.dtype, FERRY_DTYPE_F8_E4M3);
  const auto& s13 = p.at("model.layers.0.mlp.experts.w13_weight_scale_inv");
  EXPECT_EQ(s13.first, w13.first + 1);
  EXPECT_EQ(s13.second.dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(s13.second.shape, (std::vector<std::uint64_t>{4, 6, 2}));  // [E, 768/128, 256/128]
  EXPECT_EQ(p.at("model.layers.0.mlp.experts.w2_weight_scale_inv").second.shape,
            (std::vector<std::uint64_t>{4, 2, 3}));
  EXPECT_EQ(p.at("model.layers.0.self_attn.qkv_proj.weight_scale_inv").second.shape,
            (std::vector<std::uint64_t>{6, 2}));
  EXPECT_EQ(p.at("model.layers.0.self_attn.o_proj.weight").second.dtype, FERRY_DTYPE_F8_E4M3);
  // The default unquantized set: norms, embeddings, lm_head, the router.
  for (const char* kept : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                           "model.layers.0.mlp.gate.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.self_attn.q_norm.weight"}) {
    EXPECT_EQ(p.at(kept).second.dtype, FERRY_DTYPE_BF16) << kept;
    EXPECT_EQ(p.count(std::string(kept) + "_scale_inv"), 0u) << kept;
  }
}

TEST(LowbitPlan, OpsIntoQuantizedWeightsFollowTheScaleConvention) {
  LowbitModel m = make(1, 2, 0, 2, {{"scale_fmt", "ue8m0"}});
  const auto params = m.target_layout(catalog(4, 256));
  const auto p = by_name(params);
  const auto ops = m.plan({{"model.layers.0.mlp.experts.1.up_proj.weight", FERRY_DTYPE_BF16, {256, kH}},
                           {"model.layers.0.mlp.experts.1.down_proj.weight", FERRY_DTYPE_BF16, {kH, 256}},
                           {"model.layers.0.mlp.gate.weight", FERRY_DTYPE_BF16, {4, kH}}});
  ASSERT_EQ(ops.size(), 3u);
  const auto& up = ops[0];
  EXPECT_EQ(up.transform, FERRY_TRANSFORM_FP8_BLOCK_QUANT);
  EXPECT_EQ(up.dst_dtype, FERRY_DTYPE_F8_E4M3);
  EXPECT_EQ(up.dst_param, p.at("model.layers.0.mlp.experts.w13_weight").first);
  EXPECT_EQ(up.scale_param, p.at("model.layers.0.mlp.experts.w13_weight_scale_inv").first);
  EXPECT_EQ(up.flags, static_cast<std::uint32_t>(FERRY_OP_SCALE_UE8M0));
  EXPECT_EQ(up.rows, 128u);  // this TP rank's 128 rows of the expert's up_proj
  EXPECT_EQ(up.cols, kH);
  EXPECT_EQ(up.dst_row_stride, kH);
  EXPECT_EQ(up.src_row_stride, kH);
  EXPECT_EQ(up.src_offset, 128 * kH);
  EXPECT_EQ(up.dst_offset, (1 * 256 + 128) * kH);  // slot 1, after its gate rows
  const auto& down = ops[1];
  EXPECT_EQ(down.rows, kH);
  EXPECT_EQ(down.cols, 128u);
  EXPECT_EQ(down.dst_row_stride, 128u);
  EXPECT_EQ(down.src_row_stride, 256u);
  EXPECT_EQ(down.dst_offset, 1 * kH * 128);
  EXPECT_EQ(ops[2].transform, FERRY_TRANSFORM_COPY);  // the router stays bf16
  const auto located = m.locate({"model.layers.0.mlp.experts.1.up_proj.weight", FERRY_DTYPE_INVALID, {}});
  EXPECT_EQ(located.dst_offset, up.dst_offset);
  EXPECT_EQ(located.dst_dtype, FERRY_DTYPE_F8_E4M3);
}

TEST(LowbitOptions, UnquantizedListIsConfigurable) {
  LowbitModel all = make(0, 1, 0, 1, {{"unquantized", "norm"}});
  const auto p = by_name(all.target_layout(catalog(2, 128)));
  EXPECT_EQ(p.at("model.embed_tokens.weight").second.dtype, FERRY_DTYPE_F8_E4M3);
  EXPECT_EQ(p.at("model.layers.0.mlp.gate.weight").second.dtype, FERRY_DTYPE_F8_E4M3);
  EXPECT_EQ(p.at("model.norm.weight").second.dtype, FERRY_DTYPE_BF16);
  LowbitModel experts_only = make(0, 1, 0, 1, {{"unquantized", "self_attn, embed, lm_head, gate.weight"}});
  const auto q = by_name(experts_only.target_layout(catalog(2, 128)));
  EXPECT_EQ(q.at("model.layers.0.self_attn.qkv_proj.weight").second.dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(q.at("model.layers.0.mlp.experts.w2_weight").second.dtype, FERRY_DTYPE_F8_E4M3);
  EXPECT_EQ(error_of([] { make(0, 1, 0, 1, {{"scale_fmt", "e8m0"}}); }).code(),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error_of([] { make(0, 1, 0, 1, {{"block", "64"}}); }).what(),
              HasSubstr("unknown option 'block'"));
}

TEST(LowbitErrors, TensorParallelShardOffA128BoundaryIsRefused) {
  // moe_intermediate 384 over tp 2: 192 rows per rank.
  LowbitModel m = make(0, 2, 0, 1);
  const auto err = error_of([&] { m.target_layout(catalog(2, 384)); });
  EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(err.what(), HasSubstr("tensor-parallel shard of 192 rows is not a multiple of 128"));
  EXPECT_THAT(err.what(), HasSubstr("model.layers.0.mlp.experts.0.gate_proj.weight"));
  EXPECT_THAT(err.what(), HasSubstr("shard of 192 columns"));  // down_proj
}

TEST(LowbitErrors, FusedPartOffA128BoundaryIsRefused) {
  // k/v of 64 rows: k's part of qkv_proj ends at row 320, inside a block.
  LowbitModel m = make(0, 1, 0, 1);
  const auto err = error_of([&] { m.target_layout(catalog(2, 128, 64)); });
  EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(err.what(), HasSubstr("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_THAT(err.what(), HasSubstr("not whole 128x128 blocks"));
}

TEST(LowbitErrors, PartialBlocksAtAMatrixEdgeAreFine) {
  // Hidden size 200: every matrix has a partial column block, and o_proj / down_proj (200 rows)
  // a partial row block; no fused part ends inside a block, so the layout is accepted.
  std::vector<Tensor> c = {{"model.embed_tokens.weight", FERRY_DTYPE_BF16, {64, 200}},
                           {"model.norm.weight", FERRY_DTYPE_BF16, {200}}};
  const std::string p = "model.layers.0.";
  for (auto [n, s] : std::vector<std::pair<std::string, std::vector<std::uint64_t>>>{
           {"input_layernorm.weight", {200}}, {"self_attn.q_proj.weight", {128, 200}},
           {"self_attn.k_proj.weight", {128, 200}}, {"self_attn.v_proj.weight", {128, 200}},
           {"self_attn.o_proj.weight", {200, 128}}, {"post_attention_layernorm.weight", {200}},
           {"mlp.gate_proj.weight", {128, 200}}, {"mlp.up_proj.weight", {128, 200}},
           {"mlp.down_proj.weight", {200, 128}}}) {
    c.push_back(Tensor{p + n, FERRY_DTYPE_BF16, s});
  }
  LowbitModel m = make(0, 1, 0, 1);
  const auto params = by_name(m.target_layout(c));
  EXPECT_EQ(params.at(p + "self_attn.qkv_proj.weight_scale_inv").second.shape,
            (std::vector<std::uint64_t>{3, 2}));
  EXPECT_EQ(params.at(p + "mlp.down_proj.weight_scale_inv").second.shape,
            (std::vector<std::uint64_t>{2, 1}));
  const auto ops = m.plan({{p + "mlp.down_proj.weight", FERRY_DTYPE_BF16, {200, 128}}});
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].rows, 200u);
  EXPECT_EQ(ops[0].cols, 128u);
}

}  // namespace
