// update/update_direct.cpp: direct delivery (docs/architecture.md, "Three ways to deliver"): where
// a peer may write a tensor in place, the declaration that it does, the buckets it wrote recorded,
// and what it wrote verified at commit in one pass (see update/update_engine.hpp).
#include "update/update_engine.hpp"

#include "update/block_plan.hpp"
#include "update/cuda_apply.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <chrono>
#include <map>

namespace ferry::update {
namespace {

// Bytes from `offset` (into a parameter) to the next 1 MiB chunk boundary (0 on one): where the
// chunk hashes of a piece written at `offset` start (Destination.chunkHead).
std::uint64_t chunk_head(std::uint64_t offset) {
  constexpr std::uint64_t C = kernels::kFingerprintChunkBytes;
  return (C - offset % C) % C;
}

}  // namespace

std::optional<UpdateEngine::DirectDestination> UpdateEngine::direct_destination_locked(
    const ferry_plan_op_t& op, const ferry_tensor_desc_t& desc) const {
  const auto count = element_count(std::span<const std::uint64_t>(desc.shape, desc.ndim));
  const auto esize = dtype_size(desc.dtype);
  if (!count || esize == 0 || op.transform != FERRY_TRANSFORM_COPY || op.src_dtype != desc.dtype ||
      op.dst_dtype != desc.dtype || op.src_offset != 0 || op.dst_param >= targets_.size()) {
    return std::nullopt;
  }
  const auto& target = targets_[op.dst_param];
  const auto covered = checked_mul(op.rows, op.cols);
  const bool contiguous =
      op.rows <= 1 || (op.src_row_stride == op.cols && op.dst_row_stride == op.cols);
  const auto end = checked_add(op.dst_offset, *count);
  if (!target.device || !covered || *covered != *count || !contiguous || !end ||
      *end > target.view.elements) {
    return std::nullopt;
  }
  DirectDestination d;
  d.data = target.view.data + op.dst_offset * esize;
  d.bytes = *count * esize;
  d.block = target.block;
  d.block_bytes = target.block_bytes;
  d.param_offset = op.dst_offset * esize;
  d.param_bytes = target.bytes;
  if (d.block == nullptr || d.data < d.block || d.data + d.bytes > d.block + d.block_bytes) {
    return std::nullopt;
  }
  return d;
}

std::vector<std::optional<UpdateEngine::DirectDestination>> UpdateEngine::direct_destinations(
    std::span<const ferry_tensor_desc_t> tensors) {
  std::lock_guard lock(op_mutex_);
  bool active = false;
  {
    std::lock_guard state(state_mutex_);
    active = active_;
  }
  if (!active) bind_layout_locked();
  // Every push of a training run sends the same catalog: its answer is kept while the targets'
  // memory stays where it was.
  std::string key = manifest::catalog_key(tensors);
  std::vector<const std::byte*> where;
  where.reserve(2 * targets_.size());
  for (const auto& t : targets_) {
    where.push_back(t.view.data);
    where.push_back(t.block);
  }
  if (key == destinations_key_ && where == destinations_where_) return destinations_;
  auto out = compute_direct_destinations_locked(tensors);
  destinations_key_ = std::move(key);
  destinations_where_ = std::move(where);
  destinations_ = out;
  return out;
}

std::vector<std::optional<UpdateEngine::DirectDestination>>
UpdateEngine::compute_direct_destinations_locked(std::span<const ferry_tensor_desc_t> tensors) {
  std::vector<std::optional<DirectDestination>> out(tensors.size());
  // One plan call for the whole catalog (a call per tensor cost ~1 us each); where some tensor
  // has no plan, per tensor, so that the error stays that tensor's.
  try {
    const auto ops = plans_.plan(tensors);
    std::vector<std::uint32_t> op_count(tensors.size(), 0);
    std::vector<std::size_t> op_index(tensors.size(), 0);
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (ops[k].src_tensor >= tensors.size()) continue;
      ++op_count[ops[k].src_tensor];
      op_index[ops[k].src_tensor] = k;
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (op_count[i] == 1) out[i] = direct_destination_locked(ops[op_index[i]], tensors[i]);
    }
    return out;
  } catch (const Error&) {
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    try {
      const auto ops = plans_.plan(tensors.subspan(i, 1));
      if (ops.size() == 1) out[i] = direct_destination_locked(ops[0], tensors[i]);
    } catch (const Error&) {
      // No plan here: the tensor goes the staged way, where the same error is reported.
    }
  }
  return out;
}

std::vector<std::optional<UpdateEngine::DirectDestination>> UpdateEngine::block_destinations(
    std::span<const ferry_tensor_desc_t> catalog, std::span<const BlockRef> blocks) {
  std::lock_guard lock(op_mutex_);
  bool active = false;
  {
    std::lock_guard state(state_mutex_);
    active = active_;
  }
  if (!active) bind_layout_locked();
  std::vector<std::optional<DirectDestination>> out(blocks.size());
  std::vector<std::vector<ferry_plan_op_t>> by_tensor(catalog.size());
  try {
    for (const auto& op : plans_.plan(catalog)) {
      if (op.src_tensor < catalog.size()) by_tensor[op.src_tensor].push_back(op);
    }
  } catch (const Error&) {
    return out;  // no plan: every block is staged, where the same error is reported
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const BlockRef& block = blocks[b];
    if (block.tensor >= catalog.size()) continue;
    const ferry_tensor_desc_t& whole = catalog[block.tensor];
    if (block.extents.size() != whole.ndim || block.offsets.size() != whole.ndim) continue;
    ferry_tensor_desc_t desc = whole;
    for (std::uint32_t d = 0; d < whole.ndim; ++d) desc.shape[d] = block.extents[d];
    try {
      const auto ops = restrict_to_block(
          by_tensor[block.tensor], std::span<const std::uint64_t>(whole.shape, whole.ndim),
          block.offsets, block.extents, whole.name ? whole.name : "");
      if (ops.size() == 1) out[b] = direct_destination_locked(ops[0], desc);
    } catch (const Error&) {
      // Not a block the plan can take in place: staged.
    }
  }
  return out;
}

void UpdateEngine::begin_direct_writes(bool writer_fingerprints) {
  std::lock_guard lock(op_mutex_);
  std::lock_guard state(state_mutex_);
  if (!active_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "begin_direct_writes: no update is active");
  }
  direct_writes_ = true;
  writer_fingerprints_ = writer_fingerprints;
  dirty_ = true;
}

void UpdateEngine::record_direct_bucket(std::span<const std::uint8_t> manifest_bytes) {
  Bucket b;
  b.in_place = true;
  b.manifest_bytes.assign(manifest_bytes.begin(), manifest_bytes.end());
  record_direct(b);
}

void UpdateEngine::record_direct(Bucket& bucket) {
  std::lock_guard lock(op_mutex_);
  std::uint64_t version = 0;
  {
    std::lock_guard state(state_mutex_);
    if (!active_ || !direct_writes_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "record_direct_bucket: no update with direct writes is active");
    }
    version = active_version_;
  }
  const auto started = std::chrono::steady_clock::now();
  current_bucket_.reset();
  try {
    const manifest::Manifest& m = bucket_manifest_locked(bucket, version);
    const auto cached = cache_.get_entry(m, plans_);
    const PlanOps ops = cached->ops;
    // Each entry: exactly one op, a whole contiguous copy into a device parameter.
    std::vector<const ferry_plan_op_t*> op_of(m.tensors.size(), nullptr);
    for (const auto& op : *ops) {
      if (op.src_tensor >= m.tensors.size() || op_of[op.src_tensor] != nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "direct delivery needs one copy per tensor; the plan has another op for entry {}",
             op.src_tensor);
      }
      op_of[op.src_tensor] = &op;
    }
    std::vector<InPlaceWrite> writes;
    writes.reserve(m.tensors.size());
    std::uint64_t bytes = 0;
    const auto descs = manifest::tensor_descs(m);
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
      const auto& e = m.tensors[i];
      const auto dest = op_of[i] ? direct_destination_locked(*op_of[i], descs[i]) : std::nullopt;
      if (!dest) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "tensor '{}' was written in place, but its plan is not one whole copy into a device "
             "parameter",
             e.name);
      }
      if (dest->bytes != e.size) {
        fail(FERRY_STATUS_CORRUPT_DATA, "tensor '{}': {} bytes announced, its destination has {}",
             e.name, e.size, dest->bytes);
      }
      const auto& op = *op_of[i];
      writes.push_back({dest->data, dest->bytes, e.fingerprint, op.dst_param,
                        op.dst_offset == 0 && dest->bytes == targets_[op.dst_param].bytes,
                        dest->param_offset, {}});
      bytes += dest->bytes;
    }
    for (std::size_t i = 0; i < m.tensors.size(); ++i) record_written(*op_of[i]);
    for (auto& w : writes) in_place_.push_back(std::move(w));
    ++buckets_this_update_;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::lock_guard state(state_mutex_);
    metrics_.buckets_applied += 1;
    metrics_.bytes_applied += bytes;
    metrics_.seconds_applying += seconds;
  } catch (const std::exception& e) {
    const std::string where =
        current_bucket_ ? fmt::format("at bucket {} (written in place)", *current_bucket_)
                        : fmt::format("at bucket #{} (manifest unreadable)", buckets_this_update_);
    fail_locked(where, e.what());
    throw;
  }
}

void UpdateEngine::attach_direct_fingerprints(
    std::span<const std::uint64_t> prints, std::span<const std::vector<std::uint64_t>> chunk_hashes) {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (!active_ || !direct_writes_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "attach_direct_fingerprints: no update with direct writes is active");
    }
  }
  try {
    if (prints.size() != in_place_.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{} writer fingerprints for {} tensors written in place", prints.size(),
           in_place_.size());
    }
    if (!chunk_hashes.empty() && chunk_hashes.size() != prints.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{} lists of chunk hashes for {} writer fingerprints",
           chunk_hashes.size(), prints.size());
    }
    const auto& layout = plans_.layout();
    const bool trusted = writer_fingerprints_ && options_.trust_writer_fingerprints;
    for (std::size_t i = 0; i < chunk_hashes.size(); ++i) {
      const auto& hashes = chunk_hashes[i];
      if (hashes.empty()) continue;
      const auto& w = in_place_[i];
      // A piece that starts inside a chunk was hashed from the next chunk boundary on (its
      // writer fingerprint then covers that part only: only a receiver that trusts the writer's
      // fingerprints asks for that, Destination.chunkHead).
      const std::uint64_t head = chunk_head(w.offset);
      const std::uint64_t expected =
          head >= w.bytes ? 0
                          : (w.bytes - head + kernels::kFingerprintChunkBytes - 1) /
                                kernels::kFingerprintChunkBytes;
      if ((head > 0 && !trusted) || hashes.size() != expected) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "parameter '{}': {} chunk hashes for {} bytes written at byte {} (expected {}{})",
             layout[w.param].name, hashes.size(), w.bytes, w.offset, head > 0 && !trusted ? 0 : expected,
             head > 0 && !trusted ? ": the piece starts inside a chunk and the writer's "
                                    "fingerprints are not trusted" : "");
      }
    }
    for (std::size_t i = 0; i < prints.size(); ++i) {
      if (in_place_[i].expected) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "parameter '{}': a second fingerprint from the copy that wrote it",
             plans_.layout()[in_place_[i].param].name);
      }
      in_place_[i].expected = prints[i];
      if (!chunk_hashes.empty()) in_place_[i].chunk_hashes = chunk_hashes[i];
    }
  } catch (const std::exception& e) {
    fail_locked("at commit (writer fingerprints)", e.what());
    throw;
  }
}

std::vector<std::optional<std::uint64_t>> UpdateEngine::verify_in_place_locked() {
  std::vector<std::optional<std::uint64_t>> known(targets_.size());
  if (in_place_.empty()) return known;
  const auto& layout = plans_.layout();
  // Writer fingerprints, trusted: what the writing copy hashed as it stored each tensor.
  const bool trusted = writer_fingerprints_ && options_.trust_writer_fingerprints;
  std::vector<const std::byte*> data;
  std::vector<std::uint64_t> bytes;
  std::vector<std::size_t> reread;  // indices into in_place_
  for (std::size_t i = 0; i < in_place_.size(); ++i) {
    const auto& w = in_place_[i];
    if (writer_fingerprints_ && !w.expected) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "parameter '{}' was written in place without a fingerprint from the copy that wrote "
           "it",
           layout[w.param].name);
    }
    if (trusted && w.expected) {
      if (w.whole) known[w.param] = *w.expected;
      continue;
    }
    reread.push_back(i);
    data.push_back(w.data);
    bytes.push_back(w.bytes);
    commit_reads_.piece_bytes += w.bytes;
  }
  if (trusted) assemble_from_chunks_locked(known);
  if (reread.empty()) return known;
  const auto prints = cuda_locked().fingerprints(data, bytes);
  for (std::size_t k = 0; k < reread.size(); ++k) {
    const std::size_t i = reread[k];
    const auto& w = in_place_[i];
    const auto& print = prints[k];
    if (options_.verify_fingerprints && w.expected && print != *w.expected) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "parameter '{}': fingerprint of what was written in place {:016x} differs from the "
           "sender's {:016x}",
           layout[w.param].name, print, *w.expected);
    }
    if (w.whole) known[w.param] = print;
  }
  return known;
}

void UpdateEngine::assemble_from_chunks_locked(std::vector<std::optional<std::uint64_t>>& known) {
  constexpr std::uint64_t C = kernels::kFingerprintChunkBytes;
  // Per parameter written in pieces with chunk hashes: its chunk hashes as far as pieces hashed
  // whole chunks of it.
  struct Chunks {
    std::vector<std::uint64_t> hashes;
    std::vector<bool> have;
  };
  std::map<std::uint32_t, Chunks> params;
  for (const auto& w : in_place_) {
    if (w.whole || w.chunk_hashes.empty() || known[w.param]) continue;
    const std::uint64_t size = targets_[w.param].bytes;
    auto [it, added] = params.try_emplace(w.param);
    if (added) {
      it->second.hashes.assign((size + C - 1) / C, 0);
      it->second.have.assign(it->second.hashes.size(), false);
    }
    // The hashes start at the piece's first chunk boundary (chunk_head bytes in).
    const std::uint64_t head = chunk_head(w.offset);
    const std::uint64_t base = (w.offset + head) / C;
    for (std::uint64_t j = 0; j < w.chunk_hashes.size(); ++j) {
      const std::uint64_t k = base + j;
      if (k >= it->second.hashes.size()) break;
      // The piece's chunk j is the parameter's chunk k only when it holds all of it.
      const std::uint64_t in_piece = std::min(C, w.bytes - head - j * C);
      const std::uint64_t in_param = std::min(C, size - k * C);
      if (in_piece != in_param) continue;
      it->second.hashes[k] = w.chunk_hashes[j];
      it->second.have[k] = true;
    }
  }
  // The chunks no piece hashed whole (where pieces meet inside a chunk), read in one pass.
  std::vector<const std::byte*> data;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> index;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> slots;
  for (auto& [param, c] : params) {
    const std::uint64_t size = targets_[param].bytes;
    for (std::uint64_t k = 0; k < c.hashes.size(); ++k) {
      if (c.have[k]) continue;
      data.push_back(targets_[param].view.data + k * C);
      bytes.push_back(std::min(C, size - k * C));
      index.push_back(k);
      slots.emplace_back(param, k);
      commit_reads_.chunk_bytes += bytes.back();
    }
  }
  if (!data.empty()) {
    const auto hashes = cuda_locked().chunk_hashes(data, bytes, index);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      params[slots[i].first].hashes[slots[i].second] = hashes[i];
    }
  }
  for (const auto& [param, c] : params) {
    known[param] = kernels::combine_chunk_hashes(c.hashes, targets_[param].bytes);
  }
}


}  // namespace ferry::update
