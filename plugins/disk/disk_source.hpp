// disk/disk_source.hpp: a validated checkpoint as a stream of buckets: packs whole tensors, in
// catalog order, into caller-owned host buffers and fills them with parallel pread.
#pragma once

#include <ferry/sdk/manifest.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ferry/formats/safetensors.hpp>

namespace ferry::disk {

// Tensors larger than this are split into pieces read by different threads.
inline constexpr std::uint64_t kDefaultChunkBytes = 16ull << 20;

// Called by reader threads between chunks; throws ferry::Error (TIMEOUT, ABORTED) to stop the
// read. Must be safe to call from several threads at once.
using Interrupt = std::function<void()>;

// One bucket just read: its manifest (bucket_count is the number of buckets planned for the
// capacity used) and how many bytes of the destination it covers (bucket_bytes).
struct BucketRead {
  manifest::Manifest manifest;
  std::uint64_t bytes_written = 0;
};

// Not thread-safe: the plugin serializes calls per source (plugin.h). A read uses up to
// `threads` worker threads internally and joins them before returning.
class DiskSource {
 public:
  // Reads and validates the whole checkpoint at `uri` (a file, an index, or a directory) and
  // keeps its files open. Throws ferry::Error (NOT_FOUND, IO, CORRUPT_DATA, and CORRUPT_DATA when
  // the catalog cannot be expressed as a manifest, e.g. a name over the manifest's limit).
  explicit DiskSource(const std::string& uri, std::uint64_t chunk_bytes = kDefaultChunkBytes);

  // Every tensor, sorted by file then offset; bucket_count 0, offsets 0, sizes set.
  const manifest::Manifest& catalog() const noexcept { return catalog_; }
  const safetensors::Checkpoint& checkpoint() const noexcept { return checkpoint_; }

  // Fills `dst` with the next whole tensors that fit, laid out by sdk::pack_buckets (each at a
  // multiple of FERRY_BUCKET_ALIGNMENT; the padding is zeroed), using up to `threads` readers (at least 1). Returns nullopt at the end
  // of the stream. Throws INVALID_ARGUMENT naming a tensor larger than dst (before anything is
  // read), IO naming the file on a failed or short read; after a failure the same bucket is read
  // again by the next call.
  std::optional<BucketRead> read(std::span<std::uint8_t> dst, unsigned threads,
                                 const Interrupt& interrupt = {});

 private:
  struct Location {
    int fd;
    const std::string* path;
    std::uint64_t file_offset;
    std::uint64_t size;
  };

  // Splits the tensors from next_ on into buckets of `capacity` bytes.
  void plan(std::uint64_t capacity);

  safetensors::Checkpoint checkpoint_;
  manifest::Manifest catalog_;
  std::vector<Location> locations_;  // parallel to catalog_.tensors
  std::uint64_t chunk_bytes_;

  std::size_t next_ = 0;            // first tensor not yet delivered
  std::uint32_t buckets_done_ = 0;  // buckets delivered so far (the next bucket_index)
  // The plan for the capacity last used: bucket_ends_[k] is one past the last tensor of bucket
  // plan_base_ + k, offsets_[i - plan_first_] where tensor i starts in its bucket. Re-made when a
  // read brings another capacity.
  bool planned_ = false;
  std::uint64_t planned_capacity_ = 0;
  std::uint32_t plan_base_ = 0;
  std::size_t plan_first_ = 0;
  std::vector<std::size_t> bucket_ends_;
  std::vector<std::uint64_t> offsets_;
};

}  // namespace ferry::disk
