// update/update_apply.cpp: applying one staged bucket (UpdateEngine::apply_staged): the manifest
// checked against the active update, entry fingerprints verified before any byte is written (a
// bucket read in place from device memory: as its plan runs, before it is acknowledged), the
// cached plan split by memory kind, then the CPU and CUDA scatters; and the host staging the
// update loop's sources read into (see update/update_engine.hpp).
#include "update/update_engine.hpp"

#include "update/cuda_apply.hpp"

#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ferry::update {
namespace {

// A cached plan split by where its destinations live, with the device op table (PlanAttachment,
// kept in the plan cache). Built for one set of entry offsets and parameter addresses.
struct ExecutionPlan final : PlanAttachment {
  std::vector<ferry_plan_op_t> host_ops;    // copy / cast into host parameters
  std::vector<ferry_plan_op_t> device_ops;  // copy / cast into device parameters
  // FP8_BLOCK_QUANT ops (kernels::fp8_block_quant_cpu / fp8_block_quant_cuda), by memory kind.
  std::vector<ferry_plan_op_t> host_fp8_ops;
  std::vector<ferry_plan_op_t> device_fp8_ops;
  std::shared_ptr<const void> prepared;  // device_ops prepared by CudaApplier (null if none)
};

// A bucket read in place (Bucket::entry_data): its entries as offsets from one base, aligned to
// 256 bytes below the lowest entry (so each entry keeps its own alignment for the kernels), and
// the span from that base to the end of the highest one. The span is never read as a whole: the
// memory between entries may not even be mapped. Empty entries sit at the base.
struct SpanningBucket {
  std::span<const std::byte> bucket;
  std::vector<std::uint64_t> offsets;
};
SpanningBucket spanning_bucket(std::span<const kernels::EntryView> entries,
                               const manifest::Manifest& m) {
  constexpr std::uintptr_t kAlign = 256;
  std::uintptr_t lo = UINTPTR_MAX;
  std::uintptr_t hi = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (m.tensors[i].size == 0) continue;
    const auto at = reinterpret_cast<std::uintptr_t>(entries[i].data);
    if (at == 0 || m.tensors[i].size > UINTPTR_MAX - at) {
      fail(FERRY_STATUS_INTERNAL, "tensor '{}' read in place has no valid address",
           m.tensors[i].name);
    }
    lo = std::min(lo, at);
    hi = std::max<std::uintptr_t>(hi, at + m.tensors[i].size);
  }
  if (lo > hi) lo = hi = kAlign;  // nothing to read
  const std::uintptr_t base = std::max(kAlign, lo / kAlign * kAlign);
  SpanningBucket out;
  out.offsets.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out.offsets.push_back(
        m.tensors[i].size == 0 ? 0 : reinterpret_cast<std::uintptr_t>(entries[i].data) - base);
  }
  out.bucket = {reinterpret_cast<const std::byte*>(base), static_cast<std::size_t>(hi - base)};
  return out;
}

// Aligned host memory for a staging bucket; page-locked when `pinned` (and CUDA is built in).
std::shared_ptr<std::byte> new_staging(std::uint64_t bytes, bool pinned) {
#if FERRY_UPDATE_HAVE_CUDA
  if (pinned) return CudaApplier::pinned_host(bytes);
#else
  (void)pinned;
#endif
  void* p = ::operator new(static_cast<std::size_t>(std::max<std::uint64_t>(bytes, 1)),
                           std::align_val_t{FERRY_BUCKET_ALIGNMENT});
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) {
    ::operator delete(q, std::align_val_t{FERRY_BUCKET_ALIGNMENT});
  });
}

}  // namespace

std::span<std::byte> UpdateEngine::host_staging(int slot, std::uint64_t bytes) {
  std::lock_guard lock(op_mutex_);
  if (slot != 0 && slot != 1) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "host_staging: slot {} is not 0 or 1", slot);
  }
  bytes = std::max<std::uint64_t>(sdk::bucket_align_up(bytes), FERRY_BUCKET_ALIGNMENT);
  // Page-locked when a layout parameter lives on a device (the layout is not re-bound here: an
  // update may be active).
  bool pinned = false;
  for (const auto& param : plans_.layout()) {
    const auto index = store_.find(param.name);
    pinned = pinned || (index && store_.param(*index).memory_kind == FERRY_MEMORY_CUDA);
  }
  auto& buffer = staging_[static_cast<std::size_t>(slot)];
  auto& size = staging_bytes_[static_cast<std::size_t>(slot)];
  auto& is_pinned = staging_pinned_[static_cast<std::size_t>(slot)];
  if (!buffer || size < bytes || is_pinned != pinned) {
    buffer.reset();
    size = 0;
    buffer = new_staging(bytes, pinned);
    size = bytes;
    is_pinned = pinned;
  }
  return {buffer.get(), static_cast<std::size_t>(size)};
}

void UpdateEngine::apply_bucket(std::span<const std::byte> bucket,
                                std::span<const std::uint8_t> manifest_bytes,
                                ferry_memory_kind_t bucket_kind) {
  Bucket b;
  b.data = bucket;
  b.kind = bucket_kind;
  b.manifest_bytes.assign(manifest_bytes.begin(), manifest_bytes.end());
  apply_staged(b);
}

void UpdateEngine::apply(Bucket& bucket) {
  if (bucket.in_place) {
    record_direct(bucket);
  } else {
    apply_staged(bucket);
  }
}

const manifest::Manifest& UpdateEngine::bucket_manifest_locked(Bucket& bucket,
                                                                std::uint64_t version) {
  current_bucket_.reset();
  if (!bucket.manifest) bucket.manifest = manifest::decode(bucket.manifest_bytes);
  const manifest::Manifest& m = *bucket.manifest;
  current_bucket_ = m.bucket_index;
  if (m.bucket_count == 0) {
    fail(FERRY_STATUS_CORRUPT_DATA, "the manifest is a catalog (bucket_count 0), not a bucket");
  }
  if (m.version != 0 && m.version != version) {
    fail(FERRY_STATUS_CORRUPT_DATA, "the bucket belongs to update {}, not to the active update",
         m.version);
  }
  return m;
}

void UpdateEngine::apply_staged(Bucket& b) {
  std::span<const std::byte> bucket = b.data;
  const ferry_memory_kind_t bucket_kind = b.kind;
  std::lock_guard lock(op_mutex_);
  std::uint64_t version = 0;
  {
    std::lock_guard state(state_mutex_);
    if (!active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "apply_bucket: no update is active (call begin first)");
    }
    version = active_version_;
  }
  const auto started = std::chrono::steady_clock::now();
  current_bucket_.reset();
  try {
    const manifest::Manifest& m = bucket_manifest_locked(b, version);
    const bool read_in_place = !b.entry_data.empty();
    if (!read_in_place && m.bucket_bytes != bucket.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "the manifest describes {} bucket bytes but {} arrived",
           m.bucket_bytes, bucket.size());
    }
    if (read_in_place && b.entry_data.size() != m.tensors.size()) {
      fail(FERRY_STATUS_INTERNAL, "{} addresses given for the {} entries of bucket {}",
           b.entry_data.size(), m.tensors.size(), m.bucket_index);
    }
    std::vector<kernels::EntryView> entries;
    entries.reserve(m.tensors.size());
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
      const auto& e = m.tensors[i];
      const auto end = checked_add(e.offset, e.size);
      const auto count = element_count(e.shape);
      if (!end || (!read_in_place && *end > bucket.size()) || !count) {
        fail(FERRY_STATUS_CORRUPT_DATA, "tensor '{}' lies outside the bucket", e.name);
      }
      entries.push_back(
          {read_in_place ? b.entry_data[i] : bucket.data() + e.offset, e.dtype, *count});
    }
    // Read in place: the entries lie wherever the sender's tensors are mapped. The kernels take
    // them as offsets from one base, as in a bucket spanning them all (never read as a whole).
    std::vector<std::uint64_t> offsets;
    offsets.reserve(m.tensors.size());
    if (read_in_place) {
      const auto spanned = spanning_bucket(entries, m);
      bucket = spanned.bucket;
      offsets = spanned.offsets;
    } else {
      for (const auto& e : m.tensors) offsets.push_back(e.offset);
    }
    const bool device_bucket = bucket_kind == FERRY_MEMORY_CUDA;
    // The entries' fingerprints against the manifest's. A bucket read in place from device
    // memory is fingerprinted on the apply stream right before its plan, and compared once both
    // are done: at once (one wait), or, where the source keeps the bytes readable until the
    // commit (Bucket::readable_until_commit), at the commit, after its one wait for every
    // bucket's kernels, so that the next buckets' kernels queue behind these with no gap
    // (verify_read_in_place_locked). A mismatch fails the update, which the engine, dirty from
    // the plans' writes, rolls back or fences. Any other bucket is verified before anything is
    // written.
    std::vector<std::size_t> checked;  // the entries with a fingerprint, where they lie
    std::vector<const std::byte*> checked_data;
    std::vector<std::uint64_t> checked_sizes;
    if (options_.verify_fingerprints) {
      for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        if (!m.tensors[i].fingerprint) continue;
        checked.push_back(i);
        checked_data.push_back(entries[i].data);
        checked_sizes.push_back(m.tensors[i].size);
      }
    }
    const bool verify_as_applied =
        read_in_place && device_bucket && b.entry_fingerprints.empty() && !checked.empty();
    if (verify_as_applied) {
      ReadCheck check;
      check.manifest_bytes = b.manifest_bytes;
      check.entries.reserve(checked.size());
      check.expected.reserve(checked.size());
      for (std::size_t i : checked) {
        check.entries.push_back(static_cast<std::uint32_t>(i));
        check.expected.push_back(*m.tensors[i].fingerprint);
      }
      cuda_locked().queue_fingerprints(checked_data, checked_sizes);
      read_checks_.push_back(std::move(check));
    } else if (!checked.empty()) {
      std::vector<std::uint64_t> actual;
      if (!b.entry_fingerprints.empty()) {
        // Computed by the source from these bytes (its acknowledgement's): compared, not
        // computed again.
        if (b.entry_fingerprints.size() != m.tensors.size()) {
          fail(FERRY_STATUS_INTERNAL, "{} fingerprints given for the {} entries of bucket {}",
               b.entry_fingerprints.size(), m.tensors.size(), m.bucket_index);
        }
        for (std::size_t i : checked) actual.push_back(b.entry_fingerprints[i]);
      } else if (device_bucket) {
        actual = cuda_locked().fingerprints(checked_data, checked_sizes);
      } else {
        for (std::size_t k = 0; k < checked.size(); ++k) {
          actual.push_back(
              kernels::fingerprint_cpu(checked_data[k], checked_sizes[k], options_.threads));
        }
      }
      for (std::size_t k = 0; k < checked.size(); ++k) {
        const auto& e = m.tensors[checked[k]];
        if (actual[k] != *e.fingerprint) {
          fail(FERRY_STATUS_CORRUPT_DATA,
               "tensor '{}': fingerprint of the received bytes {:016x} differs from the sender's "
               "{:016x}",
               e.name, actual[k], *e.fingerprint);
        }
      }
    }
    const auto cached = cache_.get_entry(m, plans_);
    const PlanOps ops = cached->ops;
    for (std::size_t i = 0; i < ops->size(); ++i) {
      const auto& op = (*ops)[i];
      const bool fp8 = op.transform == FERRY_TRANSFORM_FP8_BLOCK_QUANT;
      if (op.src_tensor >= entries.size() || op.dst_param >= targets_.size() ||
          (fp8 && op.scale_param >= targets_.size())) {
        fail(FERRY_STATUS_INTERNAL,
             "plan op #{} names entry {} / parameter {} outside the bucket ({} entries) or the "
             "layout ({} parameters)",
             i, op.src_tensor, op.dst_param, entries.size(), targets_.size());
      }
    }
    std::vector<kernels::ParamView> views;
    views.reserve(targets_.size());
    for (const auto& t : targets_) views.push_back(t.view);
    const bool any_device = has_device_targets_locked();
    if (!any_device && device_bucket) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "a bucket in device memory cannot be applied to parameters in host memory");
    }
    // The split by memory kind (and the device op table) is cached with the plan, for these
    // entry offsets.
    auto* exec = dynamic_cast<ExecutionPlan*>(cached->attachment.get());
    if (exec == nullptr || cached->attachment_key != offsets) {
      auto built = std::make_shared<ExecutionPlan>();
      for (const auto& op : *ops) {
        const bool fp8 = op.transform == FERRY_TRANSFORM_FP8_BLOCK_QUANT;
        const bool device = targets_[op.dst_param].device;
        if (fp8 && targets_[op.scale_param].device != device) {
          fail(FERRY_STATUS_UNIMPLEMENTED,
               "an FP8 op writes parameter '{}' and its scales '{}' in different memory kinds",
               plans_.layout()[op.dst_param].name, plans_.layout()[op.scale_param].name);
        }
        auto& list = fp8 ? (device ? built->device_fp8_ops : built->host_fp8_ops)
                         : (device ? built->device_ops : built->host_ops);
        list.push_back(op);
      }
      if (!built->device_ops.empty()) {
        built->prepared = cuda_locked().prepare(built->device_ops, entries, offsets, views);
      }
      cached->attachment = built;
      cached->attachment_key = std::move(offsets);
      exec = built.get();
    }
    if (!ops->empty()) {
      std::lock_guard state(state_mutex_);
      dirty_ = true;
    }
    // Host parameters: the CPU kernels read host bytes.
    if (!exec->host_ops.empty() || !exec->host_fp8_ops.empty()) {
      if (device_bucket) {
        fail(FERRY_STATUS_UNIMPLEMENTED,
             "a bucket in device memory cannot be applied to parameters in host memory");
      }
      if (!exec->host_ops.empty()) {
        kernels::scatter_cpu(exec->host_ops, entries, views, options_.threads);
      }
      // FP8 block quantization (FERRY_TRANSFORM_FP8_BLOCK_QUANT) of host parameters.
      if (!exec->host_fp8_ops.empty()) {
        kernels::fp8_block_quant_cpu(exec->host_fp8_ops, entries, views, options_.threads);
      }
    }
    // Device parameters: staged (host bucket) or in place (device bucket), on the CUDA streams;
    // FP8 block quantization runs there too (kernels::fp8_block_quant_cuda), after the scatter.
    if (!exec->device_ops.empty() || !exec->device_fp8_ops.empty()) {
      CudaApplier::Fp8Ops fp8;
      if (!exec->device_fp8_ops.empty()) {
        fp8 = {exec->device_fp8_ops, entries, cached->attachment_key, views};
      }
      cuda_locked().apply(exec->prepared, bucket, device_bucket, fp8,
                          !(read_in_place && b.readable_until_commit));
    }
    if (verify_as_applied && !b.readable_until_commit) verify_read_in_place_locked();
    for (const auto& op : *ops) record_written(op);
    ++buckets_this_update_;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::lock_guard state(state_mutex_);
    metrics_.buckets_applied += 1;
    metrics_.bytes_applied += bucket_payload_bytes(b);
    metrics_.seconds_applying += seconds;
    metrics_.plan_cache_hits = cache_.hits();
    metrics_.plan_cache_misses = cache_.misses();
  } catch (const std::exception& e) {
    const std::string where =
        current_bucket_ ? fmt::format("at bucket {}", *current_bucket_)
                        : fmt::format("at bucket #{} (manifest unreadable)", buckets_this_update_);
    fail_locked(where, e.what());
    throw;
  } catch (...) {
    fail_locked(fmt::format("at bucket #{}", buckets_this_update_), "unknown exception");
    throw;
  }
}


}  // namespace ferry::update
