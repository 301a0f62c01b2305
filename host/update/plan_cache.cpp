// The plan cache: signature lookup, confirmation against the stored entries, fill on miss.
#include "update/plan_cache.hpp"

#include "update/block_plan.hpp"

#include <ferry/sdk/error.hpp>

namespace ferry::update {

PlanOps PlanCache::get(const manifest::Manifest& manifest, PlanProvider& provider) {
  return get_entry(manifest, provider)->ops;
}

void PlanCache::clear_attachments() noexcept {
  for (auto& [key, cached] : plans_) {
    cached.plan->attachment.reset();
    cached.plan->attachment_key.clear();
  }
}

std::shared_ptr<CachedPlan> PlanCache::get_entry(const manifest::Manifest& manifest,
                                                 PlanProvider& provider) {
  std::vector<Shape> entries;
  entries.reserve(manifest.tensors.size());
  for (const auto& e : manifest.tensors) {
    Shape shape{e.name, e.dtype, e.shape, {}};
    if (e.block) {
      shape.block = e.block->global_shape;
      shape.block.insert(shape.block.end(), e.block->offsets.begin(), e.block->offsets.end());
    }
    entries.push_back(std::move(shape));
  }
  const std::uint64_t key = manifest::signature(manifest);
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second.entries == entries) {
    ++hits_;
    return it->second.plan;
  }
  ++misses_;
  auto descs = manifest::tensor_descs(manifest);
  // A block of a global tensor (a sharded sender's piece) is planned as the whole tensor, then
  // restricted to the block (update/block_plan.hpp): the model plugin sees whole tensors only.
  bool blocks = false;
  for (std::size_t i = 0; i < descs.size(); ++i) {
    const auto& block = manifest.tensors[i].block;
    if (!block) continue;
    blocks = true;
    for (std::size_t d = 0; d < block->global_shape.size(); ++d) {
      descs[i].shape[d] = block->global_shape[d];
    }
  }
  std::vector<ferry_plan_op_t> ops = provider.plan(descs);
  if (blocks) {
    std::vector<std::vector<ferry_plan_op_t>> by_entry(descs.size());
    for (const auto& op : ops) {
      if (op.src_tensor >= descs.size()) {
        fail(FERRY_STATUS_INTERNAL, "plan op names entry {} of a bucket of {}", op.src_tensor,
             descs.size());
      }
      by_entry[op.src_tensor].push_back(op);
    }
    ops.clear();
    for (std::size_t i = 0; i < descs.size(); ++i) {
      const auto& e = manifest.tensors[i];
      if (!e.block) {
        ops.insert(ops.end(), by_entry[i].begin(), by_entry[i].end());
        continue;
      }
      const auto restricted =
          restrict_to_block(by_entry[i], e.block->global_shape, e.block->offsets, e.shape, e.name);
      ops.insert(ops.end(), restricted.begin(), restricted.end());
    }
  }
  auto plan = std::make_shared<CachedPlan>();
  plan->ops = std::make_shared<const std::vector<ferry_plan_op_t>>(std::move(ops));
  if (plans_.size() >= capacity_) plans_.clear();
  plans_[key] = Cached{std::move(entries), plan};
  return plan;
}

}  // namespace ferry::update
