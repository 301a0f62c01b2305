// Packing a checkpoint's tensors into buckets and reading them with parallel pread (see
// disk/disk_source.hpp).
#include "disk/disk_source.hpp"

#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace ferry::disk {
namespace {

struct Chunk {
  int fd;
  const std::string* path;
  std::uint64_t file_offset;
  std::uint8_t* dst;
  std::uint64_t size;
};

// Reads every chunk using up to `threads` threads (the caller's thread is one of them). The
// first failure stops the others at their next chunk and is rethrown here.
void read_chunks(const std::vector<Chunk>& chunks, unsigned threads, const Interrupt& interrupt) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() noexcept {
    try {
      for (;;) {
        if (failed.load(std::memory_order_relaxed)) return;
        const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= chunks.size()) return;
        if (interrupt) interrupt();
        const Chunk& c = chunks[i];
        safetensors::read_at(c.fd, {c.dst, static_cast<std::size_t>(c.size)}, c.file_offset,
                             *c.path);
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true);
    }
  };
  const std::size_t helpers =
      std::min<std::size_t>(std::max(threads, 1u), chunks.size()) - (chunks.empty() ? 0 : 1);
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  try {
    for (std::size_t i = 0; i < helpers; ++i) pool.emplace_back(work);
  } catch (...) {
    // Could not start all helpers (thread limit): the ones started and this thread finish.
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

DiskSource::DiskSource(const std::string& uri, std::uint64_t chunk_bytes)
    : checkpoint_(safetensors::read_checkpoint(uri, /*keep_open=*/true)),
      chunk_bytes_(std::max<std::uint64_t>(chunk_bytes, 1)) {
  for (const safetensors::File& file : checkpoint_.files) {
    for (const safetensors::TensorInfo& t : file.tensors) {
      manifest::Entry entry;
      entry.name = t.name;
      entry.dtype = t.dtype;
      entry.shape = t.shape;
      entry.size = t.size();
      catalog_.tensors.push_back(std::move(entry));
      locations_.push_back({file.fd.get(), &file.path, file.data_offset() + t.begin, t.size()});
    }
  }
  // Catches what safetensors allows but a manifest does not (very long names, too many tensors),
  // so that no bucket is produced from a checkpoint whose catalog could not be sent.
  try {
    manifest::validate(catalog_);
  } catch (const Error& e) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: the checkpoint cannot be described as a manifest: {}",
         uri, e.what());
  }
}

void DiskSource::plan(std::uint64_t capacity) {
  planned_ = false;  // stays false if this throws, so the next read plans again
  bucket_ends_.clear();
  offsets_.clear();
  std::vector<std::uint64_t> sizes;
  sizes.reserve(locations_.size() - next_);
  for (std::size_t i = next_; i < locations_.size(); ++i) {
    const std::uint64_t size = locations_[i].size;
    if (size > capacity) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "tensor '{}' is {} bytes, larger than the destination bucket of {} bytes",
           catalog_.tensors[i].name, size, capacity);
    }
    sizes.push_back(size);
  }
  sdk::BucketPacking packing = sdk::pack_buckets(sizes, capacity);
  for (const sdk::PackedBucket& b : packing.buckets) bucket_ends_.push_back(next_ + b.end);
  offsets_ = std::move(packing.offsets);
  if (bucket_ends_.size() > UINT32_MAX - buckets_done_) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} buckets of {} bytes would be needed, more than {}",
         bucket_ends_.size(), capacity, UINT32_MAX - buckets_done_);
  }
  planned_ = true;
  planned_capacity_ = capacity;
  plan_base_ = buckets_done_;
  plan_first_ = next_;
}

std::optional<BucketRead> DiskSource::read(std::span<std::uint8_t> dst, unsigned threads,
                                           const Interrupt& interrupt) {
  if (next_ >= locations_.size()) return std::nullopt;
  if (!planned_ || planned_capacity_ != dst.size()) plan(dst.size());
  const std::size_t end = bucket_ends_.at(buckets_done_ - plan_base_);

  BucketRead bucket;
  manifest::Manifest& m = bucket.manifest;
  m.version = 0;
  m.bucket_index = buckets_done_;
  m.bucket_count = static_cast<std::uint32_t>(plan_base_ + bucket_ends_.size());
  std::vector<Chunk> chunks;
  std::uint64_t used = 0;
  for (std::size_t i = next_; i < end; ++i) {
    const Location& loc = locations_[i];
    const std::uint64_t start = offsets_[i - plan_first_];
    std::memset(dst.data() + used, 0, start - used);  // padding: deterministic bucket bytes
    manifest::Entry entry = catalog_.tensors[i];
    entry.offset = start;
    m.tensors.push_back(std::move(entry));
    for (std::uint64_t done = 0; done < loc.size; done += chunk_bytes_) {
      chunks.push_back({loc.fd, loc.path, loc.file_offset + done, dst.data() + start + done,
                        std::min(chunk_bytes_, loc.size - done)});
    }
    used = start + loc.size;
  }
  m.bucket_bytes = used;
  bucket.bytes_written = used;

  read_chunks(chunks, threads, interrupt);
  next_ = end;
  ++buckets_done_;
  return bucket;
}

}  // namespace ferry::disk
