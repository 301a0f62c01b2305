// The CUDA side of applying buckets: staging slots, streams, events and prepared scatters (see
// update/cuda_apply.hpp).
#include "update/cuda_apply.hpp"

#include "common/log.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/kernels/cuda.hpp>
#include <ferry/sdk/error.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace ferry::update {
namespace {

// Pageable buckets go to the device through page-locked pieces of this size.
constexpr std::uint64_t kBounceBytes = 64ull << 20;
// Device staging slots grow in steps of this, so slightly larger buckets do not reallocate.
constexpr std::uint64_t kSlotGrain = 64ull << 20;
// Where prepared plans pretend the bucket starts (only offsets are kept; 16-byte aligned).
constexpr std::uintptr_t kPreparedBase = 256;

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const ferry_status_code_t code =
      err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL;
  fail(code, "CUDA update path: {}: {} ({})", what, cudaGetErrorString(err),
       cudaGetErrorName(err));
}

// Makes `device` current for the scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) check(cudaSetDevice(device), "selecting the device");
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace

struct CudaApplier::Cuda {
  int device = 0;
  cudaStream_t copy_stream = nullptr;
  cudaStream_t apply_stream = nullptr;
  std::array<std::byte*, 2> slot{};  // device staging buckets
  std::array<std::uint64_t, 2> slot_bytes{};
  std::array<cudaEvent_t, 2> copied{};
  std::array<cudaEvent_t, 2> scattered{};
  int next_slot = 0;
  std::array<std::byte*, 2> bounce{};  // page-locked pieces for pageable buckets
  std::array<cudaEvent_t, 2> bounce_free{};
  std::uint64_t* results = nullptr;  // device fingerprint results
  std::size_t results_capacity = 0;
  // Page-locked host memory mapped into the device, which the kernels write directly (one GPU
  // operation, no copy back): chunk hashes at commit (chunk_hashes) and fingerprints queued
  // without a wait (queue_fingerprints).
  struct MappedWords {
    std::uint64_t* host = nullptr;
    std::size_t capacity = 0;
    // At least `n` words (nothing queued may still write the old ones); the device's pointer.
    std::uint64_t* reserve(std::size_t n, const char* what) {
      const auto checked = [what](cudaError_t err, const char* step) {
        if (err != cudaSuccess) check(err, fmt::format("{} {}", step, what).c_str());
      };
      if (capacity < n) {
        if (host != nullptr) checked(cudaFreeHost(host), "freeing");
        host = nullptr;
        capacity = 0;
        checked(cudaHostAlloc(reinterpret_cast<void**>(&host), n * sizeof(std::uint64_t),
                              cudaHostAllocMapped),
                "allocating mapped host memory for");
        capacity = n;
      }
      std::uint64_t* device = nullptr;
      checked(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0),
              "mapping into the device:");
      return device;
    }
    void free() noexcept {
      if (host != nullptr) (void)cudaFreeHost(host);
    }
  };
  MappedWords mapped_hashes;
  // One batch of queued fingerprints per bucket read in place since the last take; kept (and
  // reused) across updates.
  std::vector<MappedWords> mapped_prints;
  std::vector<std::size_t> queued_prints;  // the words of each batch queued

  void free_all() noexcept {
    for (auto* p : slot) {
      if (p != nullptr) (void)cudaFree(p);
    }
    for (auto* p : bounce) {
      if (p != nullptr) (void)cudaFreeHost(p);
    }
    if (results != nullptr) (void)cudaFree(results);
    mapped_hashes.free();
    for (auto& words : mapped_prints) words.free();
    for (auto e : copied) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    for (auto e : scattered) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    for (auto e : bounce_free) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (copy_stream != nullptr) (void)cudaStreamDestroy(copy_stream);
    if (apply_stream != nullptr) (void)cudaStreamDestroy(apply_stream);
  }

  // A device staging slot of at least `bytes`; waits for the slot's last reader before
  // reallocating it.
  std::byte* ensure_slot(int s, std::uint64_t bytes) {
    if (slot_bytes[s] >= bytes) return slot[s];
    check(cudaEventSynchronize(scattered[s]), "waiting for a staging bucket's last scatter");
    if (slot[s] != nullptr) check(cudaFree(slot[s]), "freeing a staging bucket");
    slot[s] = nullptr;
    slot_bytes[s] = 0;
    const std::uint64_t size = (bytes + kSlotGrain - 1) / kSlotGrain * kSlotGrain;
    check(cudaMalloc(reinterpret_cast<void**>(&slot[s]), size),
          "allocating a device staging bucket");
    slot_bytes[s] = size;
    return slot[s];
  }

  // Copies pageable host bytes to the device through the two page-locked pieces on the copy
  // stream; returns once every piece has been copied out of the pageable memory.
  void copy_pageable(std::byte* dst, const std::byte* src, std::uint64_t bytes) {
    for (int i = 0; i < 2; ++i) {
      if (bounce[i] == nullptr) {
        check(cudaHostAlloc(reinterpret_cast<void**>(&bounce[i]), kBounceBytes,
                            cudaHostAllocDefault),
              "allocating a page-locked staging piece");
      }
    }
    int piece = 0;
    for (std::uint64_t done = 0; done < bytes; done += kBounceBytes, piece ^= 1) {
      const std::uint64_t n = std::min(kBounceBytes, bytes - done);
      check(cudaEventSynchronize(bounce_free[piece]), "waiting for a staging piece");
      std::memcpy(bounce[piece], src + done, n);
      check(cudaMemcpyAsync(dst + done, bounce[piece], n, cudaMemcpyHostToDevice, copy_stream),
            "copying a bucket piece to the device");
      check(cudaEventRecord(bounce_free[piece], copy_stream), "recording a staging piece");
    }
  }
};

CudaApplier::CudaApplier(int device) : cuda_(std::make_unique<Cuda>()) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    fail(FERRY_STATUS_NOT_FOUND, "CUDA device {} is not visible ({} device(s))", device, count);
  }
  cuda_->device = device;
  DeviceScope scope(device);
  try {
    check(cudaStreamCreateWithFlags(&cuda_->copy_stream, cudaStreamNonBlocking),
          "creating the copy stream");
    check(cudaStreamCreateWithFlags(&cuda_->apply_stream, cudaStreamNonBlocking),
          "creating the apply stream");
    for (int i = 0; i < 2; ++i) {
      check(cudaEventCreateWithFlags(&cuda_->copied[i], cudaEventDisableTiming), "events");
      check(cudaEventCreateWithFlags(&cuda_->scattered[i], cudaEventDisableTiming), "events");
      check(cudaEventCreateWithFlags(&cuda_->bounce_free[i], cudaEventDisableTiming), "events");
    }
  } catch (...) {
    cuda_->free_all();
    throw;
  }
}

CudaApplier::~CudaApplier() {
  const std::string error = drain();
  if (!error.empty()) logger("update")->error("CUDA update path at shutdown: {}", error);
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(cuda_->device);
  cuda_->free_all();
  if (previous >= 0) (void)cudaSetDevice(previous);
}

int CudaApplier::device() const noexcept { return cuda_->device; }

std::shared_ptr<const void> CudaApplier::prepare(std::span<const ferry_plan_op_t> ops,
                                                 std::span<const kernels::EntryView> entries,
                                                 std::span<const std::uint64_t> offsets,
                                                 std::span<const kernels::ParamView> params) {
  DeviceScope scope(cuda_->device);
  const auto* base = reinterpret_cast<const std::byte*>(kPreparedBase);
  std::vector<kernels::EntryView> rebased(entries.begin(), entries.end());
  for (std::size_t i = 0; i < rebased.size() && i < offsets.size(); ++i) {
    rebased[i].data = base + offsets[i];
  }
  return kernels::prepare_scatter_cuda(ops, rebased, base, params);
}

void CudaApplier::apply(const std::shared_ptr<const void>& prepared,
                        std::span<const std::byte> bucket, bool bucket_on_device, const Fp8Ops& fp8,
                        bool wait) {
  const auto* plan = static_cast<const kernels::PreparedScatter*>(prepared.get());
  if (plan == nullptr && fp8.ops.empty()) return;
  if (plan != nullptr && plan->bucket_bytes() > bucket.size()) {
    fail(FERRY_STATUS_INTERNAL, "CUDA update path: the plan reads {} bytes of a {}-byte bucket",
         plan->bucket_bytes(), bucket.size());
  }
  DeviceScope scope(cuda_->device);
  auto& c = *cuda_;
  // Everything that reads the bucket at `base`, on the apply stream.
  auto launch = [&](const std::byte* base) {
    if (plan != nullptr) kernels::scatter_cuda(*plan, base, c.apply_stream);
    if (!fp8.ops.empty()) {
      std::vector<kernels::EntryView> rebased(fp8.entries.begin(), fp8.entries.end());
      for (std::size_t i = 0; i < rebased.size() && i < fp8.offsets.size(); ++i) {
        rebased[i].data = base + fp8.offsets[i];
      }
      kernels::fp8_block_quant_cuda(fp8.ops, rebased, fp8.params, c.apply_stream);
    }
  };
  if (bucket_on_device && reinterpret_cast<std::uintptr_t>(bucket.data()) % 16 == 0) {
    launch(bucket.data());
    if (wait) check(cudaStreamSynchronize(c.apply_stream), "applying a device bucket");
    return;
  }
  const int s = c.next_slot;
  std::byte* slot = c.ensure_slot(s, std::max<std::uint64_t>(bucket.size(), 1));
  check(cudaStreamWaitEvent(c.copy_stream, c.scattered[s], 0), "ordering the staging copy");
  if (bucket_on_device) {
    check(cudaMemcpyAsync(slot, bucket.data(), bucket.size(), cudaMemcpyDeviceToDevice,
                          c.copy_stream),
          "copying a misaligned device bucket into staging");
  } else {
    cudaPointerAttributes attributes{};
    const bool pinned = cudaPointerGetAttributes(&attributes, bucket.data()) == cudaSuccess &&
                        attributes.type == cudaMemoryTypeHost;
    (void)cudaGetLastError();
    if (pinned) {
      check(cudaMemcpyAsync(slot, bucket.data(), bucket.size(), cudaMemcpyHostToDevice,
                            c.copy_stream),
            "copying a bucket to the device");
    } else {
      c.copy_pageable(slot, bucket.data(), bucket.size());
    }
  }
  check(cudaEventRecord(c.copied[s], c.copy_stream), "recording the staging copy");
  check(cudaStreamWaitEvent(c.apply_stream, c.copied[s], 0), "ordering the scatter");
  try {
    launch(slot);
  } catch (...) {
    // The slot's readers are whatever was enqueued; the next copy into it waits for them.
    (void)cudaEventRecord(c.scattered[s], c.apply_stream);
    throw;
  }
  check(cudaEventRecord(c.scattered[s], c.apply_stream), "recording the scatter");
  c.next_slot = 1 - s;
  // The caller's bucket may be reused once its bytes are on the device.
  check(cudaEventSynchronize(c.copied[s]), "copying a bucket to the device");
}

void CudaApplier::synchronize() {
  DeviceScope scope(cuda_->device);
  check(cudaStreamSynchronize(cuda_->copy_stream), "the staging copies");
  check(cudaStreamSynchronize(cuda_->apply_stream), "the scatters");
}

std::string CudaApplier::drain() noexcept {
  try {
    synchronize();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

std::vector<std::uint64_t> CudaApplier::fingerprints(std::span<const std::byte* const> data,
                                                     std::span<const std::uint64_t> bytes) {
  DeviceScope scope(cuda_->device);
  auto& c = *cuda_;
  const std::size_t n = std::min(data.size(), bytes.size());
  std::vector<std::uint64_t> out(n, 0);
  if (n == 0) return out;
  if (c.results_capacity < n) {
    check(cudaStreamSynchronize(c.apply_stream), "waiting before growing the results");
    if (c.results != nullptr) check(cudaFree(c.results), "freeing the fingerprint results");
    c.results = nullptr;
    c.results_capacity = 0;
    check(cudaMalloc(reinterpret_cast<void**>(&c.results), n * sizeof(std::uint64_t)),
          "allocating the fingerprint results");
    c.results_capacity = n;
  }
  kernels::fingerprint_many_cuda_async(
      std::span<const void* const>(reinterpret_cast<const void* const*>(data.data()), n),
      bytes.first(n), c.results, c.apply_stream);
  check(cudaMemcpyAsync(out.data(), c.results, n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                        c.apply_stream),
        "copying the fingerprints to the host");
  check(cudaStreamSynchronize(c.apply_stream), "computing fingerprints");
  return out;
}

void CudaApplier::queue_fingerprints(std::span<const std::byte* const> data,
                                     std::span<const std::uint64_t> bytes) {
  DeviceScope scope(cuda_->device);
  auto& c = *cuda_;
  const std::size_t n = std::min(data.size(), bytes.size());
  if (n == 0) return;
  const std::size_t batch = c.queued_prints.size();
  if (c.mapped_prints.size() <= batch) c.mapped_prints.emplace_back();
  // Nothing queued writes this batch's old words (every batch was taken or dropped after a wait).
  std::uint64_t* device = c.mapped_prints[batch].reserve(n, "fingerprints");
  kernels::fingerprint_many_cuda_async(
      std::span<const void* const>(reinterpret_cast<const void* const*>(data.data()), n),
      bytes.first(n), device, c.apply_stream);
  c.queued_prints.push_back(n);
}

std::vector<std::vector<std::uint64_t>> CudaApplier::take_queued_fingerprints() {
  DeviceScope scope(cuda_->device);
  auto& c = *cuda_;
  if (c.queued_prints.empty()) return {};
  std::vector<std::size_t> queued;
  queued.swap(c.queued_prints);
  check(cudaStreamSynchronize(c.apply_stream), "computing fingerprints");
  std::vector<std::vector<std::uint64_t>> out;
  out.reserve(queued.size());
  for (std::size_t b = 0; b < queued.size(); ++b) {
    const std::uint64_t* words = c.mapped_prints[b].host;
    out.emplace_back(words, words + queued[b]);
  }
  return out;
}

void CudaApplier::drop_queued_fingerprints() noexcept {
  if (cuda_->queued_prints.empty()) return;
  // Their kernels may still write the batches: none is reused before they are done.
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(cuda_->device);
  (void)cudaStreamSynchronize(cuda_->apply_stream);
  if (previous >= 0) (void)cudaSetDevice(previous);
  cuda_->queued_prints.clear();
}

std::vector<std::uint64_t> CudaApplier::chunk_hashes(std::span<const std::byte* const> data,
                                                     std::span<const std::uint64_t> bytes,
                                                     std::span<const std::uint64_t> first_index) {
  DeviceScope scope(cuda_->device);
  auto& c = *cuda_;
  std::uint64_t chunks = 0;
  for (auto b : bytes) {
    chunks += (b + kernels::kFingerprintChunkBytes - 1) / kernels::kFingerprintChunkBytes;
  }
  std::vector<std::uint64_t> out(chunks, 0);
  if (chunks == 0) return out;
  // Every earlier call synchronized the stream, so nothing still writes the old words.
  std::uint64_t* device = c.mapped_hashes.reserve(chunks, "chunk hashes");
  kernels::fingerprint_chunks_many_cuda_async(
      std::span<const void* const>(reinterpret_cast<const void* const*>(data.data()),
                                   data.size()),
      bytes, first_index, device, c.apply_stream);
  check(cudaStreamSynchronize(c.apply_stream), "computing chunk hashes");
  std::copy_n(c.mapped_hashes.host, chunks, out.begin());
  return out;
}

void CudaApplier::copy_to_host(void* dst, const void* src, std::uint64_t bytes) {
  DeviceScope scope(cuda_->device);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_->apply_stream),
        "copying device bytes to the host");
  check(cudaStreamSynchronize(cuda_->apply_stream), "copying device bytes to the host");
}

bool CudaApplier::is_device_memory(const void* data) noexcept {
  cudaPointerAttributes attributes{};
  const bool ok = cudaPointerGetAttributes(&attributes, data) == cudaSuccess;
  (void)cudaGetLastError();
  return ok && attributes.type == cudaMemoryTypeDevice;
}

int CudaApplier::device_of(const void* data) {
  cudaPointerAttributes attributes{};
  const bool ok = cudaPointerGetAttributes(&attributes, data) == cudaSuccess;
  (void)cudaGetLastError();
  if (!ok || attributes.type != cudaMemoryTypeDevice) {
    fail(FERRY_STATUS_NOT_FOUND, "address {} is not CUDA device memory", data);
  }
  return attributes.device;
}

std::shared_ptr<std::byte> CudaApplier::pinned_host(std::uint64_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, std::max<std::uint64_t>(bytes, 1), cudaHostAllocPortable),
        "allocating page-locked staging memory");
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                    [](std::byte* q) { (void)cudaFreeHost(q); });
}

}  // namespace ferry::update
