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

void PushPlan::wait_sealed(std::size_t k) const {
  seal();
  const std::size_t wanted = std::min(k, buckets.size() - 1) + 1;
  std::unique_lock lock(sealing->mutex);
  sealing->changed.wait(lock, [&] { return sealing->sealed >= wanted || sealing->error; });
  if (sealing->sealed < wanted) std::rethrow_exception(sealing->error);
}

PlanSealing::PlanSealing(PushPlan& plan, std::span<const TensorView> tensors, std::uint64_t version,
                         std::string label, unsigned threads)
    : plan_(plan),
      tensors_(tensors),
      version_(version),
      label_(std::move(label)),
      threads_(threads) {
  plan_.sealing = std::make_shared<SealProgress>();
  plan_.seal = [this] {
    std::call_once(once_, [this] {
      thread_ = std::thread([this] { run(); });
      started_ = true;
    });
  };
}

PlanSealing::~PlanSealing() {
  if (thread_.joinable()) thread_.join();
}

void PlanSealing::wait() {
  if (started_) plan_.wait_sealed();
}

void PlanSealing::run() {
  SealProgress& progress = *plan_.sealing;
  try {
    plan_.await_producers();
    const auto start = Clock::now();
    std::vector<std::uint64_t> prints(tensors_.size(), 0);
    const auto count = static_cast<std::uint32_t>(plan_.buckets.size());
    for (std::uint32_t k = 0; k < count; ++k) {
      auto& b = plan_.buckets[k];
      // A bucket's tensors are consecutive (plan_buckets packs them in order): one launch each.
      if (!b.items.empty()) {
        const std::size_t first = b.items.front().first;
        const std::size_t end = b.items.back().first + 1;
        if (end - first != b.items.size()) {
          fail(FERRY_STATUS_INTERNAL, "bucket {}: its {} tensors are not consecutive", k,
               b.items.size());
        }
        const auto some = fingerprint_tensors(tensors_.subspan(first, end - first), threads_);
        std::copy(some.begin(), some.end(), prints.begin() + static_cast<std::ptrdiff_t>(first));
      }
      b.fingerprints.clear();
      for (const auto& item : b.items) b.fingerprints.push_back(prints[item.first]);
      b.manifest = bucket_manifest(plan_, k, tensors_, version_, label_, prints);
      {
        std::lock_guard lock(progress.mutex);
        if (k + 1 == count) seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
        progress.sealed = k + 1;
      }
      progress.changed.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(progress.mutex);
      progress.error = std::current_exception();
    }
    progress.changed.notify_all();
  }
}

}  // namespace ferry::session
