// store/cpu_weight_store.hpp: the CPU weight store: each region is an anonymous private mapping
// whose address never changes; release = madvise(MADV_DONTNEED) + mprotect(PROT_NONE), resume =
// mprotect(PROT_READ | PROT_WRITE) at the same address. The tag and parameter bookkeeping is
// TaggedRegionStore's. A background refresh of the host mirror is a memcpy on the store's worker
// thread (split over copy_threads helpers).
#pragma once

#include "store/tagged_region_store.hpp"

namespace ferry::store {

struct CpuWeightStoreOptions {
  unsigned copy_threads = 0;  // threads for mirror copies; 0: the hardware count
};

class CpuWeightStore final : public TaggedRegionStore {
 public:
  explicit CpuWeightStore(CpuWeightStoreOptions options = {});
  // Joins a running mirror refresh, then unmaps every region. Engine-owned memory is left
  // alone.
  ~CpuWeightStore() override;

 protected:
  std::uint64_t region_granularity() const override { return page_bytes_; }
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
  void mirror_changing(HostMirror*, HostMirror*) noexcept override {}

 private:
  CpuWeightStoreOptions options_;
  std::uint64_t page_bytes_;
};

}  // namespace ferry::store
