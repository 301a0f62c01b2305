// The CUDA weight store: VMM reservations mapped with large exportable chunks, release/resume by
// unmapping and remapping at the same addresses, and chunked two-stream copies to and from the
// page-locked host mirror (see store/cuda_weight_store.hpp).
//
// The driver API is reached through cudaGetDriverEntryPointByVersion rather than by linking
// libcuda: a binary that links the store then still starts (and reports "no device") on a
// machine that has the CUDA toolkit but no driver, which is where CI builds and runs it.
#include "store/cuda_weight_store.hpp"

#include "common/log.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace ferry::store {
namespace {

// The oldest CUDA version whose signatures of the symbols below we use.
constexpr unsigned kDriverApiVersion = 12000;

std::string bytes_text(std::uint64_t bytes) {
  return fmt::format("{} bytes ({:.2f} GiB)", bytes, static_cast<double>(bytes) / (1ull << 30));
}

// Throws for a runtime API error (and clears it, so it is not reported again by a later call).
void check(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  const ferry_status_code_t code =
      err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL;
  fail(code, "{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

// Makes `device` current on this thread for the scope, then restores the previous device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_ && cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
      ok_ = false;
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  // Throws when the device could not be made current.
  void require() const {
    if (!ok_) fail(FERRY_STATUS_INTERNAL, "cannot make CUDA device {} current", device_);
  }

 private:
  int device_;
  int previous_ = -1;
  bool ok_ = true;
};

// Faults in every page of [data, data + bytes) writable without changing its contents
// (MADV_POPULATE_WRITE), split over threads: page-locking then only pins resident pages, which is
// far faster than letting cudaHostRegister fault them in one by one. Best effort: an old kernel
// without MADV_POPULATE_WRITE leaves the faulting to cudaHostRegister.
void populate_parallel(std::byte* data, std::uint64_t bytes) noexcept {
  constexpr std::uint64_t kPiece = 1ull << 30;
  const std::uint64_t pieces = (bytes + kPiece - 1) / kPiece;
  const std::uint64_t threads =
      std::min<std::uint64_t>(pieces, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::uint64_t> next{0};
  auto work = [&] {
    for (std::uint64_t i = next.fetch_add(1); i < pieces; i = next.fetch_add(1)) {
      const std::uint64_t at = i * kPiece;
      if (::madvise(data + at, std::min(kPiece, bytes - at), MADV_POPULATE_WRITE) != 0) {
        next.store(pieces);  // unsupported or refused: stop early, registration faults the rest
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (std::uint64_t i = 1; i < threads; ++i) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // Fewer threads: this one still finishes the work.
  }
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

struct CudaWeightStore::Cuda {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  cudaStream_t streams[2] = {nullptr, nullptr};

  template <typename Fn>
  static void load(const char* symbol, Fn& fn) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &address, kDriverApiVersion,
                                                             cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
      (void)cudaGetLastError();
      fail(FERRY_STATUS_INTERNAL,
           "CUDA driver entry point {} (CUDA {}.{} signature) is not available: {}", symbol,
           kDriverApiVersion / 1000, kDriverApiVersion % 1000 / 10,
           err != cudaSuccess ? cudaGetErrorName(err) : "symbol not found in this driver");
    }
    fn = reinterpret_cast<Fn>(address);
  }

  std::string name(CUresult result) const {
    const char* text = nullptr;
    if (get_error_name == nullptr || get_error_name(result, &text) != CUDA_SUCCESS ||
        text == nullptr) {
      return fmt::format("CUresult {}", static_cast<int>(result));
    }
    return text;
  }
};

CudaWeightStore::CudaWeightStore(CudaWeightStoreOptions options)
    : TaggedRegionStore(FERRY_MEMORY_CUDA), options_(options), cuda_(std::make_unique<Cuda>()) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) (void)cudaGetLastError();
  if (err != cudaSuccess || options_.device < 0 || options_.device >= count) {
    fail(FERRY_STATUS_NOT_FOUND, "CUDA device {} not found ({} visible{})", options_.device,
         err == cudaSuccess ? count : 0,
         err == cudaSuccess ? std::string() : std::string(": ") + cudaGetErrorName(err));
  }
  if (options_.copy_chunk_bytes == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "CUDA weight store: copy_chunk_bytes must not be 0");
  }
  DeviceScope scope(options_.device);
  scope.require();
  check(cudaFree(nullptr), "initializing the CUDA context");

  Cuda& c = *cuda_;
  Cuda::load("cuGetErrorName", c.get_error_name);
  Cuda::load("cuMemGetAllocationGranularity", c.granularity);
  Cuda::load("cuMemAddressReserve", c.address_reserve);
  Cuda::load("cuMemAddressFree", c.address_free);
  Cuda::load("cuMemCreate", c.create);
  Cuda::load("cuMemRelease", c.release);
  Cuda::load("cuMemMap", c.map);
  Cuda::load("cuMemUnmap", c.unmap);
  Cuda::load("cuMemSetAccess", c.set_access);

  c.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  c.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  c.prop.location.id = options_.device;
  c.prop.requestedHandleTypes =
      options_.exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  c.access.location = c.prop.location;
  c.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  std::size_t granularity = 0;
  const CUresult result =
      c.granularity(&granularity, &c.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (result != CUDA_SUCCESS || granularity == 0) {
    fail(FERRY_STATUS_INTERNAL,
         "cuMemGetAllocationGranularity on CUDA device {} failed: {} (virtual memory management "
         "{}with POSIX file descriptor export may be unsupported here)",
         options_.device, c.name(result), options_.exportable ? "" : "without ");
  }
  granularity_ = granularity;
  const std::uint64_t wanted = std::max<std::uint64_t>(options_.chunk_bytes, granularity_);
  auto rounded = checked_add(wanted, granularity_ - 1);
  if (!rounded) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "CUDA weight store: chunk of {} bytes overflows", wanted);
  }
  chunk_bytes_ = *rounded / granularity_ * granularity_;

  for (auto& stream : c.streams) {
    const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (made != cudaSuccess) {
      for (auto& s : c.streams) {
        if (s != nullptr) (void)cudaStreamDestroy(s);
        s = nullptr;
      }
      check(made, "creating the weight store's copy streams");
    }
  }
  logger("store")->info(
      "CUDA weight store on device {}: granularity {} bytes, chunks of {} bytes{}", options_.device,
      granularity_, chunk_bytes_,
      options_.exportable ? ", exportable as POSIX file descriptors" : "");
}

CudaWeightStore::~CudaWeightStore() {
  join_mirror_refresh();  // its copies read the regions into the page-locked mirror
  DeviceScope scope(options_.device);
  {
    std::lock_guard lock(mutex_);
    replace_mirror_locked(nullptr);
  }
  (void)cudaDeviceSynchronize();
  for_each_region([this](const std::string&, Region& region, bool released) {
    if (!released) unmap_region(region);
    (void)cuda_->address_free(reinterpret_cast<CUdeviceptr>(region.base), region.capacity);
  });
  for (auto& stream : cuda_->streams) {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  (void)cudaGetLastError();
}

std::uint64_t CudaWeightStore::pinned_mirror_bytes() const {
  std::lock_guard lock(mutex_);
  return pinned_bytes_;
}

void CudaWeightStore::map_region(Region& region, const std::string& what, std::uint64_t asked) {
  const Cuda& c = *cuda_;
  const auto base = reinterpret_cast<CUdeviceptr>(region.base);
  const char* step = "cuMemCreate";
  CUresult result = CUDA_SUCCESS;
  for (std::uint64_t offset = 0; offset < region.capacity; offset += chunk_bytes_) {
    const std::uint64_t size = std::min(chunk_bytes_, region.capacity - offset);
    CUmemGenericAllocationHandle handle = 0;
    result = c.create(&handle, size, &c.prop, 0);
    if (result != CUDA_SUCCESS) {
      step = "cuMemCreate";
      break;
    }
    result = c.map(base + offset, size, 0, handle, 0);
    if (result != CUDA_SUCCESS) {
      (void)c.release(handle);
      step = "cuMemMap";
      break;
    }
    region.chunks.push_back(handle);
  }
  if (result == CUDA_SUCCESS) {
    result = c.set_access(base, region.capacity, &c.access, 1);
    step = "cuMemSetAccess";
  }
  if (result == CUDA_SUCCESS) return;

  const std::uint64_t mapped = region.chunks.size() * chunk_bytes_;
  unmap_region(region);
  if (result != CUDA_ERROR_OUT_OF_MEMORY) {
    fail(FERRY_STATUS_INTERNAL, "{} on CUDA device {}: {} failed: {} (unmapped again)", what,
         options_.device, step, c.name(result));
  }
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
  fail(FERRY_STATUS_OUT_OF_MEMORY,
       "{} on CUDA device {}: out of device memory: asked for {}, {} free of {} (the failure "
       "came after {} of chunks of up to {} were mapped; they are unmapped again)",
       what, options_.device, bytes_text(asked), bytes_text(free_bytes), bytes_text(total_bytes),
       bytes_text(std::min(mapped, region.capacity)), bytes_text(chunk_bytes_));
}

bool CudaWeightStore::unmap_region(Region& region) noexcept {
  const Cuda& c = *cuda_;
  const auto base = reinterpret_cast<CUdeviceptr>(region.base);
  bool ok = true;
  for (std::size_t i = 0; i < region.chunks.size(); ++i) {
    const std::uint64_t offset = i * chunk_bytes_;
    const std::uint64_t size = std::min(chunk_bytes_, region.capacity - offset);
    ok = c.unmap(base + offset, size) == CUDA_SUCCESS && ok;
    ok = c.release(region.chunks[i]) == CUDA_SUCCESS && ok;
  }
  region.chunks.clear();
  return ok;
}

void CudaWeightStore::reserve_region(const std::string& tag, Region& region) {
  DeviceScope scope(options_.device);
  scope.require();
  CUdeviceptr base = 0;
  const CUresult result = cuda_->address_reserve(&base, region.capacity, granularity_, 0, 0);
  if (result != CUDA_SUCCESS) {
    fail(result == CUDA_ERROR_OUT_OF_MEMORY ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "cannot reserve {} of device addresses for tag '{}': {}", bytes_text(region.capacity), tag,
         cuda_->name(result));
  }
  region.base = reinterpret_cast<std::byte*>(base);
  try {
    map_region(region, fmt::format("creating a region for tag '{}'", tag), region.capacity);
  } catch (...) {
    (void)cuda_->address_free(base, region.capacity);
    region.base = nullptr;
    throw;
  }
}

void CudaWeightStore::drop_memory(const std::string& tag, std::span<Region> regions) {
  DeviceScope scope(options_.device);
  scope.require();
  // Kernels queued on any stream may still read the tag (a replayed graph, say).
  check(cudaDeviceSynchronize(), fmt::format("releasing tag '{}': waiting for the device", tag));
  bool ok = true;
  for (auto& region : regions) ok = unmap_region(region) && ok;
  if (!ok) {
    fail(FERRY_STATUS_INTERNAL,
         "releasing tag '{}' on CUDA device {}: cuMemUnmap/cuMemRelease reported an error", tag,
         options_.device);
  }
}

void CudaWeightStore::map_memory(const std::string& tag, std::span<Region> regions) {
  DeviceScope scope(options_.device);
  scope.require();
  std::uint64_t asked = 0;
  for (const auto& region : regions) asked += region.capacity;
  const std::string what = fmt::format("resuming tag '{}'", tag);
  std::size_t done = 0;
  try {
    for (; done < regions.size(); ++done) map_region(regions[done], what, asked);
  } catch (...) {
    for (std::size_t i = 0; i < done; ++i) unmap_region(regions[i]);
    throw;
  }
}

void CudaWeightStore::check_external(const std::string& name, const void* data, std::uint64_t bytes,
                                     ferry_memory_kind_t kind) const {
  if (kind != FERRY_MEMORY_CUDA) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "parameter '{}': the CUDA weight store takes CUDA device memory only", name);
  }
  if (bytes == 0) return;
  DeviceScope scope(options_.device);
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, data);
  if (err != cudaSuccess) (void)cudaGetLastError();
  const bool device_memory = err == cudaSuccess && (attributes.type == cudaMemoryTypeDevice ||
                                                    attributes.type == cudaMemoryTypeManaged);
  if (!device_memory || attributes.device != options_.device) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "parameter '{}': engine-owned pointer {} is not CUDA memory of device {}", name, data,
         options_.device);
  }
}

void CudaWeightStore::copy_bytes(void* dst, const void* src, std::uint64_t bytes) const {
  DeviceScope scope(options_.device);
  scope.require();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "weight store copy");
  // From pageable memory cudaMemcpy may return before its DMA lands; readers on non-blocking
  // streams (the update engine's, a transport's) would not wait for it.
  check(cudaStreamSynchronize(cudaStreamLegacy), "weight store copy (completion)");
}

void CudaWeightStore::copy_pieces(std::span<const CopyJob> jobs, const std::string& what) {
  DeviceScope scope(options_.device);
  scope.require();
  const Cuda& c = *cuda_;
  // Pieces alternate between the two streams so that issuing one overlaps copying the other;
  // with a page-locked mirror each piece is one DMA at full PCIe speed.
  std::size_t piece = 0;
  cudaError_t err = cudaSuccess;
  for (const auto& job : jobs) {
    for (std::uint64_t at = 0; at < job.bytes && err == cudaSuccess;
         at += options_.copy_chunk_bytes) {
      const std::uint64_t n = std::min(options_.copy_chunk_bytes, job.bytes - at);
      err = cudaMemcpyAsync(static_cast<std::byte*>(job.dst) + at,
                            static_cast<const std::byte*>(job.src) + at, n, cudaMemcpyDefault,
                            c.streams[piece++ % 2]);
    }
    if (err != cudaSuccess) break;
  }
  // Always drain both streams, so that no copy is in flight after a failure.
  const cudaError_t first = cudaStreamSynchronize(c.streams[0]);
  const cudaError_t second = cudaStreamSynchronize(c.streams[1]);
  if (err == cudaSuccess) err = first != cudaSuccess ? first : second;
  check(err, what);
}

void CudaWeightStore::save_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                                 std::span<const std::byte* const> sources) {
  std::vector<CopyJob> jobs;
  jobs.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    mirror.clear_filled(entries[i]);  // a copy interrupted half way must not count as one
    jobs.push_back({mirror.slot(entries[i]), sources[i], mirror.entries()[entries[i]].bytes});
  }
  copy_pieces(jobs, "saving parameters to the host mirror");
  for (auto entry : entries) mirror.mark_filled(entry);
}

void CudaWeightStore::restore_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                                    std::span<std::byte* const> targets) {
  std::vector<CopyJob> jobs;
  jobs.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    jobs.push_back({targets[i], mirror.slot(entries[i]), mirror.entries()[entries[i]].bytes});
  }
  copy_pieces(jobs, "restoring parameters from the host mirror");
}

void CudaWeightStore::copy_to_mirror(std::span<const CopyJob> jobs) {
  // On the calling (worker) thread: copy_pieces makes the device current for its duration.
  copy_pieces(jobs, "refreshing the host mirror from the device");
}

std::shared_ptr<HostMirror> CudaWeightStore::new_mirror(std::vector<MirrorParam> layout) {
  return HostMirror::anonymous(std::move(layout));
}

void CudaWeightStore::mirror_changing(HostMirror* old_mirror, HostMirror* new_mirror) noexcept {
  DeviceScope scope(options_.device);
  if (old_mirror != nullptr && old_mirror == pinned_) {
    if (cudaHostUnregister(pinned_->data_area()) != cudaSuccess) {
      (void)cudaGetLastError();
      logger("store")->warn("cudaHostUnregister of the host mirror ({} bytes) failed",
                            pinned_bytes_);
    }
    pinned_ = nullptr;
    pinned_bytes_ = 0;
  }
  if (new_mirror == nullptr || !options_.pin_mirror || new_mirror->data_bytes() == 0) return;
  const auto start = std::chrono::steady_clock::now();
  populate_parallel(new_mirror->data_area(), new_mirror->data_bytes());
  const auto populated = std::chrono::steady_clock::now();
  const cudaError_t err =
      cudaHostRegister(new_mirror->data_area(), new_mirror->data_bytes(), cudaHostRegisterDefault);
  if (err == cudaSuccess) {
    pinned_ = new_mirror;
    pinned_bytes_ = new_mirror->data_bytes();
    const auto done = std::chrono::steady_clock::now();
    logger("store")->info(
        "page-locked the host mirror ({}): populate {:.3f} s, cudaHostRegister {:.3f} s",
        bytes_text(pinned_bytes_), std::chrono::duration<double>(populated - start).count(),
        std::chrono::duration<double>(done - populated).count());
    return;
  }
  (void)cudaGetLastError();
  if (err == cudaErrorHostMemoryAlreadyRegistered) return;  // someone else pinned it
  logger("store")->warn(
      "cannot page-lock the host mirror ({}): {}; backups use pageable copies (slower)",
      bytes_text(new_mirror->data_bytes()), cudaGetErrorString(err));
}

}  // namespace ferry::store
