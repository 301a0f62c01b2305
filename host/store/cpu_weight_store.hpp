// store/cpu_weight_store.hpp: the CPU weight store: each region is an anonymous private mapping
// whose address never changes; release = madvise(MADV_DONTNEED) + mprotect(PROT_NONE), resume =
// mprotect(PROT_READ | PROT_WRITE) at the same address.
#pragma once

#include "store/host_mirror.hpp"
#include "store/weight_store.hpp"

#include <map>
#include <mutex>
#include <unordered_map>

namespace ferry::store {

struct CpuWeightStoreOptions {
  unsigned copy_threads = 0;  // threads for mirror copies; 0: the hardware count
};

class CpuWeightStore final : public WeightStore {
 public:
  explicit CpuWeightStore(CpuWeightStoreOptions options = {});
  // Unmaps every region. Engine-owned memory is left alone.
  ~CpuWeightStore() override;
  CpuWeightStore(const CpuWeightStore&) = delete;
  CpuWeightStore& operator=(const CpuWeightStore&) = delete;

  void set_policy(const std::string& tag, Policy policy) override;
  void create_region(const std::string& tag, std::uint64_t bytes, Policy policy) override;
  std::size_t place(const std::string& tag, const std::string& name, ferry_dtype_t dtype,
                    std::span<const std::uint64_t> shape) override;
  std::size_t register_external(const std::string& tag, const std::string& name,
                                ferry_dtype_t dtype, std::span<const std::uint64_t> shape,
                                void* data, ferry_memory_kind_t kind) override;

  std::size_t param_count() const override;
  ParamInfo param(std::size_t index) const override;
  using WeightStore::param;
  std::optional<std::size_t> find(std::string_view name) const override;
  std::vector<std::string> tags() const override;
  std::vector<std::size_t> params_in(const std::string& tag) const override;
  ferry_memory_kind_t region_memory_kind() const noexcept override { return FERRY_MEMORY_HOST; }

  void write(std::size_t index, std::uint64_t offset, std::span<const std::byte> bytes) override;
  void read(std::size_t index, std::uint64_t offset, std::span<std::byte> out) const override;

  void release(std::span<const std::string> tags) override;
  void resume(std::span<const std::string> tags) override;
  bool released(const std::string& tag) const override;
  bool contents_valid(const std::string& tag) const override;
  std::string invalid_reason(const std::string& tag) const override;
  void set_contents_valid(const std::string& tag, bool valid, std::string reason) override;
  std::vector<TagState> memory_state() const override;

  void begin_writes(std::span<const std::string> tags, const std::string& writer) override;
  void end_writes(std::span<const std::string> tags) noexcept override;

  std::vector<MirrorParam> mirror_layout() const override;
  std::shared_ptr<HostMirror> mirror() const override;
  void attach_mirror(std::shared_ptr<HostMirror> mirror) override;
  void save_to_mirror(std::span<const std::string> tags) override;
  void restore_from_mirror(std::span<const std::string> tags) override;

 private:
  struct Region {
    std::byte* base = nullptr;
    std::uint64_t capacity = 0;  // mapped bytes (page multiple)
    std::uint64_t used = 0;
  };
  struct Tag {
    Policy policy = Policy::Discard;
    bool released = false;
    bool contents_valid = true;
    std::string reason;
    std::string writer;  // non-empty while begin_writes holds the tag
    std::vector<Region> regions;
    std::vector<std::size_t> params;
  };

  Tag& tag_locked(const std::string& tag);
  const Tag& tag_locked(const std::string& tag) const;
  Tag& declare_locked(const std::string& tag, Policy policy);
  void check_new_param_locked(const std::string& name, ferry_dtype_t dtype,
                              std::span<const std::uint64_t> shape, std::uint64_t& bytes,
                              std::uint64_t& elements) const;
  // Called before the set of mirrored parameters changes.
  void mirror_layout_changing_locked(const std::string& tag);
  std::vector<MirrorParam> mirror_layout_locked() const;
  HostMirror& ensure_mirror_locked();
  void save_locked(const std::string& tag);
  void restore_locked(const std::string& tag);
  const ParamInfo& checked_access_locked(std::size_t index, std::uint64_t offset,
                                         std::uint64_t bytes, const char* what) const;

  CpuWeightStoreOptions options_;
  std::uint64_t page_bytes_;
  mutable std::mutex mutex_;
  std::map<std::string, Tag> tags_;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::shared_ptr<HostMirror> mirror_;
};

}  // namespace ferry::store
