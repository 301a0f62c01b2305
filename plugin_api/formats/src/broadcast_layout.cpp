// formats/broadcast_layout.cpp: checks an update's tensor list and packs it into buckets (see
// ferry/formats/broadcast_layout.hpp).
#include <ferry/formats/broadcast_layout.hpp>

#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <set>
#include <string_view>

namespace ferry::nccl {
namespace {
constexpr std::size_t kMaxNameBytes = 1024;
}  // namespace

std::vector<TensorSpec> make_tensor_specs(const std::vector<std::string>& names,
                                          const std::vector<std::string>& dtypes,
                                          const std::vector<std::vector<std::uint64_t>>& shapes) {
  if (names.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "update: 'names' is empty");
  if (names.size() != dtypes.size() || names.size() != shapes.size()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "update: 'names', 'dtypes' and 'shapes' must have the same length (got {}, {}, {})",
         names.size(), dtypes.size(), shapes.size());
  }
  std::vector<TensorSpec> out;
  out.reserve(names.size());
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (name.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "update: names[{}] is empty", i);
    if (name.size() > kMaxNameBytes) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: names[{}] is {} bytes long (at most {})", i,
           name.size(), kMaxNameBytes);
    }
    if (name.find('\0') != std::string::npos) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: names[{}] holds a NUL byte", i);
    }
    if (!seen.insert(name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: tensor '{}' (names[{}]) is listed twice", name,
           i);
    }
    std::string_view dtype_text = dtypes[i];
    if (dtype_text.starts_with("torch.")) dtype_text.remove_prefix(6);
    const auto dtype = dtype_from_name(dtype_text);
    if (!dtype || *dtype == FERRY_DTYPE_INVALID) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: tensor '{}' (index {}): unknown dtype '{}'",
           name, i, dtypes[i]);
    }
    if (shapes[i].size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: tensor '{}' (index {}): {} dims (at most {})",
           name, i, shapes[i].size(), FERRY_MAX_DIMS);
    }
    const auto bytes = byte_size(*dtype, shapes[i]);
    if (!bytes) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "update: tensor '{}' (index {}): shape {} overflows",
           name, i, shape_string(shapes[i]));
    }
    out.push_back(TensorSpec{name, *dtype, shapes[i], *bytes});
  }
  return out;
}

void check_bucket_bytes(std::uint64_t bucket_bytes) {
  if (bucket_bytes < kMinBucketBytes || bucket_bytes > kMaxBucketBytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bucket_bytes {} is outside {}..{}", bucket_bytes,
         kMinBucketBytes, kMaxBucketBytes);
  }
}

std::vector<manifest::Manifest> plan_buckets(const std::vector<TensorSpec>& tensors,
                                             std::uint64_t bucket_bytes, std::uint64_t version) {
  check_bucket_bytes(bucket_bytes);
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  for (const auto& t : tensors) sizes.push_back(t.bytes);
  const sdk::BucketPacking packing = sdk::pack_buckets(sizes, bucket_bytes);
  std::vector<manifest::Manifest> buckets(packing.buckets.size());
  const auto count = static_cast<std::uint32_t>(buckets.size());
  for (std::uint32_t k = 0; k < count; ++k) {
    const sdk::PackedBucket& packed = packing.buckets[k];
    manifest::Manifest& m = buckets[k];
    for (std::size_t i = packed.first; i < packed.end; ++i) {
      manifest::Entry e;
      e.name = tensors[i].name;
      e.dtype = tensors[i].dtype;
      e.shape = tensors[i].shape;
      e.offset = packing.offsets[i];
      e.size = tensors[i].bytes;
      m.tensors.push_back(std::move(e));
    }
    m.bucket_bytes = packed.bytes;
    m.version = version;
    m.bucket_index = k;
    m.bucket_count = count;
    manifest::validate(m);
  }
  return buckets;
}

std::uint64_t largest_bucket(const std::vector<manifest::Manifest>& buckets) {
  std::uint64_t largest = 0;
  for (const auto& b : buckets) largest = std::max(largest, b.bucket_bytes);
  return largest;
}

}  // namespace ferry::nccl
