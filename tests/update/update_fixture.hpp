// Shared pieces of the update engine tests: an identity plan provider (each manifest entry is
// copied whole into the parameter of the same name) and a builder of real buckets + manifests.
#pragma once

#include "update/plan_provider.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace ferry::update::testing {

class IdentityPlans final : public PlanProvider {
 public:
  explicit IdentityPlans(std::vector<LayoutParam> layout) : layout_(std::move(layout)) {}

  const std::vector<LayoutParam>& layout() const override { return layout_; }

  std::vector<ferry_plan_op_t> plan(std::span<const ferry_tensor_desc_t> entries) override {
    ++calls;
    std::vector<ferry_plan_op_t> ops;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      std::size_t dst = layout_.size();
      for (std::size_t p = 0; p < layout_.size(); ++p) {
        if (layout_[p].name == entries[i].name) dst = p;
      }
      if (dst == layout_.size()) continue;  // not needed by this rank
      const auto count = element_count(std::span(entries[i].shape, entries[i].ndim)).value();
      ferry_plan_op_t op{};
      op.struct_size = sizeof(ferry_plan_op_t);
      op.src_tensor = static_cast<std::uint32_t>(i);
      op.src_dtype = entries[i].dtype;
      op.src_row_stride = count;
      op.dst_param = static_cast<std::uint32_t>(dst);
      op.dst_dtype = layout_[dst].dtype;
      op.dst_row_stride = count;
      op.rows = 1;
      op.cols = count;
      op.transform = FERRY_TRANSFORM_COPY;
      ops.push_back(op);
    }
    return ops;
  }

  int calls = 0;

 private:
  std::vector<LayoutParam> layout_;
};

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Random contents for every layout parameter (one "checkpoint" of a version).
inline std::map<std::string, std::vector<std::byte>> random_weights(
    const std::vector<LayoutParam>& layout, std::uint64_t seed) {
  std::map<std::string, std::vector<std::byte>> out;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    out[layout[i].name] = random_bytes(byte_size(layout[i].dtype, layout[i].shape).value(),
                                       seed * 1000 + i);
  }
  return out;
}

struct Bucket {
  std::vector<std::byte> bytes;
  manifest::Manifest manifest;
  std::vector<std::uint8_t> encoded() const { return manifest::encode(manifest); }
};

// Packs the named tensors (64-byte aligned) into one bucket with a manifest carrying
// fingerprints.
inline Bucket make_bucket(const std::vector<LayoutParam>& layout,
                          const std::map<std::string, std::vector<std::byte>>& weights,
                          const std::vector<std::string>& names, std::uint64_t version,
                          std::uint32_t index, std::uint32_t count) {
  Bucket b;
  b.manifest.version = version;
  b.manifest.version_label = "v" + std::to_string(version);
  b.manifest.bucket_index = index;
  b.manifest.bucket_count = count;
  for (const auto& name : names) {
    const LayoutParam* param = nullptr;
    for (const auto& p : layout) {
      if (p.name == name) param = &p;
    }
    const auto& data = weights.at(name);
    b.bytes.resize((b.bytes.size() + 63) / 64 * 64);
    manifest::Entry e;
    e.name = name;
    e.dtype = param->dtype;
    e.shape = param->shape;
    e.offset = b.bytes.size();
    e.size = data.size();
    e.fingerprint = kernels::fingerprint_cpu(data.data(), data.size());
    b.bytes.insert(b.bytes.end(), data.begin(), data.end());
    b.manifest.tensors.push_back(std::move(e));
  }
  b.manifest.bucket_bytes = b.bytes.size();
  return b;
}

template <typename Body>
Error error_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  }
  return Error(FERRY_STATUS_OK, "");
}

// Tensor descriptions of `layout` (pointing into its names), e.g. a checkpoint catalog.
inline std::vector<ferry_tensor_desc_t> descs_of(const std::vector<LayoutParam>& layout) {
  std::vector<ferry_tensor_desc_t> out;
  for (const auto& p : layout) out.push_back(manifest::tensor_desc(p.name, p.dtype, p.shape));
  return out;
}

}  // namespace ferry::update::testing
