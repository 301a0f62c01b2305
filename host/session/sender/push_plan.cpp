// The plan of one push: checks, buckets, fingerprints and manifests (see
// session/sender/push_plan.hpp).
#include "session/sender/push_plan.hpp"

#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include "ferry_build_config.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "session/channel.hpp"
#include "session/sender/tensor_reads.hpp"

namespace ferry::session {

CheckedTensors check_tensors(std::span<const TensorView> tensors, bool names_known_unique) {
  CheckedTensors checked;
  std::unordered_set<std::string_view> names;
  if (!names_known_unique) names.reserve(tensors.size());
  checked.sizes.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: a tensor has an empty name");
    if (!names_known_unique && !names.insert(t.name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' is given twice", t.name);
    }
    if (dtype_size(t.dtype) == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has an invalid dtype", t.name);
    }
    if (t.shape.size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has {} dims (at most {})", t.name,
           t.shape.size(), FERRY_MAX_DIMS);
    }
    const auto size = byte_size(t.dtype, t.shape);
    if (!size) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' is too large", t.name);
    checked.sizes.push_back(*size);
    if (t.data == nullptr && *size > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has no data", t.name);
    }
    if (t.memory_kind == FERRY_MEMORY_CUDA && !FERRY_HAVE_CUDA) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "push: tensor '{}' is in CUDA memory but this build has no CUDA (built with "
           "-Dcuda=disabled); copy it to the host first",
           t.name);
    }
    if (t.memory_kind != FERRY_MEMORY_HOST && t.memory_kind != FERRY_MEMORY_PINNED &&
        t.memory_kind != FERRY_MEMORY_CUDA) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has an unknown memory kind {}",
           t.name, static_cast<unsigned>(t.memory_kind));
    }
    checked.largest = std::max(checked.largest, *size);
    checked.total += *size;
  }
  return checked;
}

PushPlan plan_buckets(std::span<const TensorView> tensors, CheckedTensors checked,
                      std::uint64_t bucket_bytes) {
  PushPlan plan;
  plan.total = checked.total;
  plan.sizes = std::move(checked.sizes);
  plan.cuda_tensors = true;
  for (const auto& t : tensors) {
    if (t.memory_kind != FERRY_MEMORY_CUDA) {
      plan.cuda_tensors = false;
    } else if (plan.device < 0) {
      plan.device = t.device;
    }
  }
  plan.capacity = sdk::bucket_align_up(std::max<std::uint64_t>(
      std::min<std::uint64_t>(bucket_bytes, sdk::bucket_align_up(checked.total)),
      std::max<std::uint64_t>(checked.largest, 1)));
  const sdk::BucketPacking packing = sdk::pack_buckets(plan.sizes, plan.capacity);
  for (const sdk::PackedBucket& packed : packing.buckets) {
    PlannedBucket& b = plan.buckets.emplace_back();
    for (std::size_t t = packed.first; t < packed.end; ++t) {
      b.items.emplace_back(t, packing.offsets[t]);
      b.cuda = b.cuda && tensors[t].memory_kind == FERRY_MEMORY_CUDA;
    }
    b.bytes = packed.bytes;
  }
  if (plan.buckets.empty()) plan.buckets.emplace_back();  // no tensors: one empty bucket
  for (const auto& b : plan.buckets) plan.bucket_total += b.bytes;
  return plan;
}

std::vector<std::uint8_t> bucket_manifest(const PushPlan& plan, std::uint32_t k,
                                          std::span<const TensorView> tensors,
                                          std::uint64_t version, const std::string& label,
                                          std::span<const std::uint64_t> prints) {
  const auto& b = plan.buckets[k];
  manifest::Manifest m;
  m.version = version;
  m.version_label = label;
  m.bucket_index = k;
  m.bucket_count = static_cast<std::uint32_t>(plan.buckets.size());
  m.bucket_bytes = b.bytes;
  m.tensors.reserve(b.items.size());
  for (const auto& [index, offset] : b.items) {
    const auto& t = tensors[index];
    manifest::Entry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.offset = offset;
    e.size = plan.sizes[index];
    if (!prints.empty()) e.fingerprint = prints[index];
    if (!t.global_shape.empty()) {
      manifest::Block block;
      block.global_shape = t.global_shape;
      block.offsets = t.offsets.empty() ? std::vector<std::uint64_t>(t.shape.size(), 0) : t.offsets;
      e.block = std::move(block);
    }
    m.tensors.push_back(std::move(e));
  }
  return manifest::encode(m);
}

PlanSealing::PlanSealing(PushPlan& plan, std::span<const TensorView> tensors,
                         std::uint64_t version, std::string label, unsigned threads)
    : plan_(plan),
      tensors_(tensors),
      version_(version),
      label_(std::move(label)),
      threads_(threads),
      task_([this] { run(); }) {
  plan_.sealed = task_.get_future().share();
  plan_.seal = [this] {
    std::call_once(once_, [this] {
      thread_ = std::thread(std::move(task_));
      started_ = true;
    });
  };
}

PlanSealing::~PlanSealing() {
  if (thread_.joinable()) thread_.join();
}

void PlanSealing::wait() {
  if (started_) plan_.sealed.get();
}

void PlanSealing::run() {
  plan_.await_producers();
  const auto start = Clock::now();
  const std::vector<std::uint64_t> prints = fingerprint_tensors(tensors_, threads_);
  const auto count = static_cast<std::uint32_t>(plan_.buckets.size());
  for (std::uint32_t k = 0; k < count; ++k) {
    auto& b = plan_.buckets[k];
    for (const auto& item : b.items) b.fingerprints.push_back(prints[item.first]);
    b.manifest = bucket_manifest(plan_, k, tensors_, version_, label_, prints);
  }
  seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace ferry::session
