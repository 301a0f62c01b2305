// The CPU weight store: anonymous mappings with stable addresses, released through
// madvise/mprotect, copies through memcpy and the host mirror's parallel copies.
#include "store/cpu_weight_store.hpp"

#include <ferry/sdk/error.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::store {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

CpuWeightStore::CpuWeightStore(CpuWeightStoreOptions options)
    : TaggedRegionStore(FERRY_MEMORY_HOST),
      options_(options),
      page_bytes_(static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE))) {}

CpuWeightStore::~CpuWeightStore() {
  join_mirror_refresh();  // it reads the regions
  for_each_region(
      [](const std::string&, Region& region, bool) { ::munmap(region.base, region.capacity); });
}

void CpuWeightStore::reserve_region(const std::string& tag, Region& region) {
  void* base = ::mmap(nullptr, region.capacity, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    fail(FERRY_STATUS_OUT_OF_MEMORY, "cannot reserve a region of {} bytes for tag '{}': {}",
         region.capacity, tag, errno_text());
  }
  region.base = static_cast<std::byte*>(base);
}

void CpuWeightStore::drop_memory(const std::string& tag, std::span<Region> regions) {
  for (auto& region : regions) {
    if (::madvise(region.base, region.capacity, MADV_DONTNEED) != 0 ||
        ::mprotect(region.base, region.capacity, PROT_NONE) != 0) {
      fail(FERRY_STATUS_IO, "releasing tag '{}': {}", tag, errno_text());
    }
  }
}

void CpuWeightStore::map_memory(const std::string& tag, std::span<Region> regions) {
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (::mprotect(regions[i].base, regions[i].capacity, PROT_READ | PROT_WRITE) != 0) {
      const auto why = errno_text();
      for (std::size_t j = 0; j < i; ++j)
        ::mprotect(regions[j].base, regions[j].capacity, PROT_NONE);
      fail(FERRY_STATUS_OUT_OF_MEMORY, "resuming tag '{}': {}", tag, why);
    }
  }
}

void CpuWeightStore::check_external(const std::string& name, const void*, std::uint64_t,
                                    ferry_memory_kind_t kind) const {
  if (kind != FERRY_MEMORY_HOST && kind != FERRY_MEMORY_PINNED) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "parameter '{}': the CPU weight store takes host or pinned memory only", name);
  }
}

void CpuWeightStore::copy_bytes(void* dst, const void* src, std::uint64_t bytes) const {
  std::memcpy(dst, src, bytes);
}

void CpuWeightStore::save_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                                std::span<const std::byte* const> sources) {
  mirror.save(entries, sources);
}

void CpuWeightStore::restore_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                                   std::span<std::byte* const> targets) {
  mirror.restore(entries, targets);
}

void CpuWeightStore::copy_to_mirror(std::span<const CopyJob> jobs) {
  copy_parallel(jobs, options_.copy_threads);
}

std::shared_ptr<HostMirror> CpuWeightStore::new_mirror(std::vector<MirrorParam> layout) {
  return HostMirror::anonymous(std::move(layout), options_.copy_threads);
}

}  // namespace ferry::store
