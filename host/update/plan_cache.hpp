// update/plan_cache.hpp: plans computed once per bucket shape and reused, keyed by the manifest
// signature (each entry's name, dtype and shape in order). A hit is confirmed against the stored
// entries, so a 64-bit signature collision recomputes instead of applying a wrong plan. Beside
// each plan the cache keeps what an executor derived from it once (PlanAttachment: for the CUDA
// path the split into host and device ops and the device op table), so a repeated update pays
// neither the plan nor its preparation again.
#pragma once

#include "update/plan_provider.hpp"

#include <ferry/sdk/manifest.hpp>

#include <memory>
#include <unordered_map>

namespace ferry::update {

using PlanOps = std::shared_ptr<const std::vector<ferry_plan_op_t>>;

// Executor state derived from one cached plan; dropped with the plan.
struct PlanAttachment {
  virtual ~PlanAttachment() = default;
};

// One cached plan. `attachment` and `attachment_key` (e.g. the entry offsets the attachment was
// built for) belong to the cache's user, who serializes access (the engine's update lock).
struct CachedPlan {
  PlanOps ops;
  std::vector<std::uint64_t> attachment_key;
  std::shared_ptr<PlanAttachment> attachment;
};

class PlanCache {
 public:
  // When `capacity` plans are held, the next miss empties the cache first.
  explicit PlanCache(std::size_t capacity = 1024) : capacity_(capacity) {}

  // The plan for `manifest`'s entries, from the cache or from `provider` on a miss.
  PlanOps get(const manifest::Manifest& manifest, PlanProvider& provider);
  // The same, with the attachment slot. The entry stays valid while the caller holds it, even
  // when the cache drops it.
  std::shared_ptr<CachedPlan> get_entry(const manifest::Manifest& manifest, PlanProvider& provider);

  void clear() noexcept { plans_.clear(); }
  // Drops every attachment (e.g. when the parameters they point at moved), keeping the plans.
  void clear_attachments() noexcept;
  std::size_t size() const noexcept { return plans_.size(); }
  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t misses() const noexcept { return misses_; }

 private:
  struct Shape {
    std::string name;
    ferry_dtype_t dtype;
    std::vector<std::uint64_t> shape;
    std::vector<std::uint64_t> block;  // a block's global shape, then its offsets; empty: whole
    friend bool operator==(const Shape&, const Shape&) = default;
  };
  struct Cached {
    std::vector<Shape> entries;
    std::shared_ptr<CachedPlan> plan;
  };
  std::size_t capacity_;
  std::unordered_map<std::uint64_t, Cached> plans_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

}  // namespace ferry::update
