// store/cuda_weight_store.hpp: the CUDA weight store: each region is a CUDA virtual-memory
// reservation whose address never changes, backed while resumed by a few large physical chunks;
// release unmaps and frees the chunks, resume maps new ones at the same addresses, and backup
// copies go through the page-locked host mirror. The tag and parameter bookkeeping is
// TaggedRegionStore's. Built only with the cuda feature (FERRY_STORE_HAVE_CUDA is 1 then).
//
// Memory (docs/architecture.md, "The weight store"; docs/benchmarks.md for why chunks are large):
//  - create_region reserves the addresses (cuMemAddressReserve) once and maps chunks of up to
//    chunk_bytes (cuMemCreate + cuMemMap + cuMemSetAccess). Every chunk is created exportable as
//    a POSIX file descriptor, so its memory can later be shared with another process.
//  - release waits for the device to go idle, unmaps and frees every chunk of the tag
//    (cuMemUnmap + cuMemRelease); the device memory is free for others (cudaMemGetInfo shows it)
//    and the addresses stay reserved. resume creates and maps new chunks at the same addresses:
//    captured CUDA graphs and raw pointers stay valid.
//  - Out of device memory on resume (or create_region) throws OUT_OF_MEMORY naming the tag, the
//    bytes asked and the bytes free; whatever was mapped before the failure is unmapped again, so
//    the tag stays released and consistent. The process never exits for it.
//  - Policy::Discard: after resume the contents are whatever the new memory holds (not zeroed;
//    contents_valid says they are invalid until the next full update). Policy::Backup: release
//    copies the parameters into the host mirror and resume copies them back, in chunks of
//    copy_chunk_bytes on two streams, at PCIe speed when the mirror is page-locked (the store
//    page-locks the mirror it holds with cudaHostRegister and unregisters it when it lets go).
//    The refresh of the mirror at a commit (refresh_mirror) is the same device-to-host copy,
//    cudaMemcpyAsync in pieces on the store's two non-blocking copy streams, issued and waited
//    for by the store's worker thread when it runs in the background; nothing else uses those
//    streams meanwhile (every backup, restore and write waits for the refresh).
//  - Engine-owned parameters must be CUDA memory of this store's device; they are written in
//    place (write(), backups, rollbacks) and never reallocated or freed.
//
// Threading: as WeightStore. Every call sets this store's device on the calling thread for its
// duration and restores the previous one.
#pragma once

#include "store/tagged_region_store.hpp"

#include <memory>

namespace ferry::store {

struct CudaWeightStoreOptions {
  int device = 0;                                // CUDA device ordinal the regions live on
  std::uint64_t chunk_bytes = 1ull << 30;        // largest physical chunk behind a region; rounded
                                                 // up to the allocation granularity
  std::uint64_t copy_chunk_bytes = 64ull << 20;  // piece size of backup / restore copies
  bool exportable = true;  // create chunks exportable as POSIX file descriptors
  bool pin_mirror = true;  // page-lock the host mirror (false: pageable, slower copies)
};

class CudaWeightStore final : public TaggedRegionStore {
 public:
  // NOT_FOUND when `options.device` is not a visible CUDA device; INTERNAL when the driver lacks
  // the virtual memory API.
  explicit CudaWeightStore(CudaWeightStoreOptions options = {});
  // Joins a running mirror refresh, then unmaps and frees every region and unregisters the
  // mirror. Engine-owned memory is left alone.
  ~CudaWeightStore() override;

  int device() const noexcept { return options_.device; }
  // The recommended allocation granularity of this device (region sizes are multiples of it).
  std::uint64_t granularity() const noexcept { return granularity_; }
  // The size of every physical chunk but the last of a region.
  std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
  // Host bytes this store holds page-locked now (the mirror's data area, when pinned by it).
  std::uint64_t pinned_mirror_bytes() const;

 protected:
  std::uint64_t region_granularity() const override { return granularity_; }
  void reserve_region(const std::string& tag, Region& region) override;
  void drop_memory(const std::string& tag, std::span<Region> regions) override;
  void map_memory(const std::string& tag, std::span<Region> regions) override;
  void check_external(const std::string& name, const void* data, std::uint64_t bytes,
                      ferry_memory_kind_t kind) const override;
  void copy_bytes(void* dst, const void* src, std::uint64_t bytes) const override;
  void save_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                  std::span<const std::byte* const> sources) override;
  void restore_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                     std::span<std::byte* const> targets) override;
  void copy_to_mirror(std::span<const CopyJob> jobs) override;
  std::shared_ptr<HostMirror> new_mirror(std::vector<MirrorParam> layout) override;
  void mirror_changing(HostMirror* old_mirror, HostMirror* new_mirror) noexcept override;

 private:
  struct Cuda;  // driver entry points and copy streams (keeps CUDA headers out of this one)

  // Creates and maps the chunks behind `region` and grants access; on failure frees what it
  // mapped and throws (OUT_OF_MEMORY with the amounts when the device is full).
  void map_region(Region& region, const std::string& what, std::uint64_t asked);
  // Unmaps and frees the chunks behind `region`. Returns false when the driver reported an error
  // (the rest is still freed).
  bool unmap_region(Region& region) noexcept;
  // Runs host <-> device copies in pieces of copy_chunk_bytes on the two copy streams.
  void copy_pieces(std::span<const CopyJob> jobs, const std::string& what);

  CudaWeightStoreOptions options_;
  std::uint64_t granularity_ = 0;
  std::uint64_t chunk_bytes_ = 0;
  std::unique_ptr<Cuda> cuda_;
  HostMirror* pinned_ = nullptr;  // the mirror whose data area this store registered
  std::uint64_t pinned_bytes_ = 0;
};

}  // namespace ferry::store
