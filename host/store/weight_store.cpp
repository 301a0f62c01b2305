// Interface-level helpers of the weight store: policy names, region sizing, place_all.
#include "store/weight_store.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

namespace ferry::store {

const char* policy_name(Policy policy) noexcept {
  return policy == Policy::Backup ? "backup" : "discard";
}

Policy policy_from_name(std::string_view name) {
  if (name == "discard") return Policy::Discard;
  if (name == "backup") return Policy::Backup;
  fail(FERRY_STATUS_INVALID_ARGUMENT, "memory policy '{}' is neither 'discard' nor 'backup'",
       name);
}

std::uint64_t region_bytes_for(std::span<const TensorSpec> specs) {
  std::uint64_t total = 0;
  for (const auto& spec : specs) {
    auto bytes = byte_size(spec.dtype, spec.shape);
    if (!bytes || spec.shape.size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter '{}' ({} {}) has no valid byte size",
           spec.name, dtype_name(spec.dtype), shape_string(spec.shape));
    }
    auto aligned = checked_add(total, kParamAlignment - 1);
    auto end = aligned ? checked_add(*aligned / kParamAlignment * kParamAlignment, *bytes)
                       : std::nullopt;
    if (!end) fail(FERRY_STATUS_INVALID_ARGUMENT, "layout size overflows at '{}'", spec.name);
    total = *end;
  }
  return total;
}

std::size_t WeightStore::place_all(const std::string& tag, Policy policy,
                                   std::span<const TensorSpec> specs) {
  create_region(tag, region_bytes_for(specs), policy);
  std::size_t first = param_count();
  for (const auto& spec : specs) place(tag, spec.name, spec.dtype, spec.shape);
  return first;
}

ParamInfo WeightStore::param(std::string_view name) const {
  auto index = find(name);
  if (!index) fail(FERRY_STATUS_NOT_FOUND, "weight store has no parameter '{}'", name);
  return param(*index);
}

}  // namespace ferry::store
