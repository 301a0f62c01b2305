// The plan cache: signature lookup, confirmation against the stored entries, fill on miss.
#include "update/plan_cache.hpp"

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
  for (const auto& e : manifest.tensors) entries.push_back({e.name, e.dtype, e.shape});
  const std::uint64_t key = manifest::signature(manifest);
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second.entries == entries) {
    ++hits_;
    return it->second.plan;
  }
  ++misses_;
  const auto descs = manifest::tensor_descs(manifest);
  auto plan = std::make_shared<CachedPlan>();
  plan->ops = std::make_shared<const std::vector<ferry_plan_op_t>>(provider.plan(descs));
  if (plans_.size() >= capacity_) plans_.clear();
  plans_[key] = Cached{std::move(entries), plan};
  return plan;
}

}  // namespace ferry::update
