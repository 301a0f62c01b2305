// update/plan_provider.hpp: what the update engine needs from a model family: the target layout
// (this rank's parameters) and the copy operations for one bucket's manifest entries.
// ModelBinding implements it over a model plugin's C table; tests implement it directly.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::update {

// One parameter of the target layout.
struct LayoutParam {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

class PlanProvider {
 public:
  virtual ~PlanProvider() = default;
  // This rank's parameters; ferry_plan_op_t::dst_param and scale_param index this vector.
  // Stable for the provider's lifetime once set. Throws FAILED_PRECONDITION when not known yet.
  virtual const std::vector<LayoutParam>& layout() const = 0;
  // The operations applying `entries` (one bucket's manifest entries, in order; src_tensor
  // indexes them). A pure function of (entries, layout): the engine caches the result by
  // manifest signature. Throws ferry::Error. Called from one thread at a time.
  virtual std::vector<ferry_plan_op_t> plan(std::span<const ferry_tensor_desc_t> entries) = 0;
};

}  // namespace ferry::update
