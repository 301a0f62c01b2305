// store/tagged_region_store.hpp: the bookkeeping every weight store shares (tags, policies,
// parameter placement, writers, contents validity, the host mirror and its layout), with the
// memory behind the regions left to a subclass (CPU: anonymous mappings; CUDA: VMM reservations).
//
// Contract with a subclass. Every hook below is called with the store's lock held (so hooks never
// run concurrently) and may throw ferry::Error; the base class keeps its state unchanged when a
// hook throws. The subclass joins a running mirror refresh (join_mirror_refresh), then frees
// its regions and forgets the mirror, first thing in its own destructor (for_each_region and
// replace_mirror_locked(nullptr) are there for that), because the base destructor runs after the
// subclass is gone. One hook, copy_to_mirror, is the exception to the lock rule: the mirror
// refresh calls it without the lock, on its worker thread (see there).
#pragma once

#include "store/host_mirror.hpp"
#include "store/weight_store.hpp"

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace ferry::store {

class TaggedRegionStore : public WeightStore {
 public:
  TaggedRegionStore(const TaggedRegionStore&) = delete;
  TaggedRegionStore& operator=(const TaggedRegionStore&) = delete;

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
  ferry_memory_kind_t region_memory_kind() const noexcept override { return region_kind_; }

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

  void refresh_mirror(std::span<const std::string> tags, const CommittedVersion& version,
                      std::span<const std::size_t> params,
                      std::span<const std::uint64_t> fingerprints, bool background) override;
  MirrorRefreshState wait_for_mirror_refresh() override;
  void preempt_mirror_refresh(const std::string& reason) override;
  // The refresh copies in batches of at most this many bytes, checking for pre-emption between
  // them (64 MiB: ~1.2 ms of a page-locked device-to-host copy, ~1% of a refresh's throughput).
  static constexpr std::uint64_t kRefreshBatchBytes = 64ull << 20;
  MirrorRefreshState mirror_refresh_state() const override;

  // For tests only: the copy of the next refresh_mirror fails with `error` (INTERNAL) instead
  // of copying. There is no real way to make a host memcpy fail, and the CUDA errors that fail
  // a device-to-host copy cannot be caused on demand without breaking the device context.
  void fail_next_mirror_refresh(std::string error);
  // For tests only (`ferry serve`'s hidden --test-mirror-refresh-delay-ms): every refresh of
  // every store in the process waits this long before its first copy, as a slow device-to-host
  // link would, so that a test can kill a receiver while a refresh is surely running. A
  // pre-emption still ends the wait. 0 (the default): no wait.
  static void delay_mirror_refreshes_for_tests(std::chrono::milliseconds delay);

 protected:
  // One reserved address range. `base` never changes; the memory behind it comes and goes.
  struct Region {
    std::byte* base = nullptr;
    std::uint64_t capacity = 0;  // reserved bytes (a multiple of region_granularity())
    std::uint64_t used = 0;      // bytes handed out to placed parameters
    // The subclass's physical allocations behind the region while it is mapped (CUDA: one
    // allocation handle per chunk; CPU: unused).
    std::vector<std::uint64_t> chunks;
  };

  explicit TaggedRegionStore(ferry_memory_kind_t region_kind) : region_kind_(region_kind) {}
  ~TaggedRegionStore() override = default;

  // ---- hooks: the memory behind regions ------------------------------------------------
  // Region sizes are rounded up to a multiple of this (a power of two).
  virtual std::uint64_t region_granularity() const = 0;
  // Reserves `capacity` bytes of addresses for `tag` with memory mapped behind them, and fills
  // region.base (and region.chunks). OUT_OF_MEMORY with the amounts when it cannot.
  virtual void reserve_region(const std::string& tag, Region& region) = 0;
  // Frees the memory behind `regions` of `tag`, keeping the addresses reserved.
  virtual void drop_memory(const std::string& tag, std::span<Region> regions) = 0;
  // Maps memory again behind every region of `tag`, at the same addresses. All or nothing: when
  // it throws, whatever it mapped has been freed again.
  virtual void map_memory(const std::string& tag, std::span<Region> regions) = 0;
  // Refuses (INVALID_ARGUMENT) engine-owned memory of a kind this store cannot address.
  virtual void check_external(const std::string& name, const void* data, std::uint64_t bytes,
                              ferry_memory_kind_t kind) const = 0;
  // The copy behind the checked write() / read() (either side may be a parameter).
  virtual void copy_bytes(void* dst, const void* src, std::uint64_t bytes) const = 0;
  // Copies parameters into mirror slots `entries` and marks them filled; copies them back.
  // restore_slots is called only after every entry was checked to be filled.
  virtual void save_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                          std::span<const std::byte* const> sources) = 0;
  virtual void restore_slots(HostMirror& mirror, std::span<const std::size_t> entries,
                             std::span<std::byte* const> targets) = 0;
  // The copy of a mirror refresh: each job from a parameter into its mirror slot. Called WITHOUT
  // the store's lock (on the refresh's worker thread, or the caller's), while every call that
  // could write those parameters or touch the mirror waits for the refresh; it may only read
  // the subclass's own immutable state. Throws on failure.
  virtual void copy_to_mirror(std::span<const CopyJob> jobs) = 0;
  // A new anonymous mirror for `layout`.
  virtual std::shared_ptr<HostMirror> new_mirror(std::vector<MirrorParam> layout) = 0;
  // Called just before the store's mirror changes from `old_mirror` to `new_mirror` (either may
  // be null), e.g. to page-lock the new one. Must not throw.
  virtual void mirror_changing(HostMirror* old_mirror, HostMirror* new_mirror) noexcept = 0;

  // ---- for subclass destructors ----------------------------------------------------------
  // Calls `fn(tag, region, released)` for every region; no lock taken (destructor use only).
  void for_each_region(const std::function<void(const std::string&, Region&, bool released)>& fn);
  // Replaces the mirror (calls mirror_changing first); null drops it.
  void replace_mirror_locked(std::shared_ptr<HostMirror> mirror);
  // Waits for a running mirror refresh and joins its thread (destructor use, before anything
  // the copy reads is freed).
  void join_mirror_refresh() noexcept;

  mutable std::mutex mutex_;

 private:
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

  // One mirror refresh, prepared under the lock and copied without it.
  struct Refresh {
    std::shared_ptr<HostMirror> mirror;
    CommittedVersion version;
    std::vector<std::size_t> entries;        // the mirror entries it fills
    std::vector<CopyJob> copies;             // parameter -> slot, one per entry
    std::vector<std::uint64_t> fingerprints;  // per mirror entry, for set_committed
    std::string fault;                        // fail_next_mirror_refresh
    std::chrono::steady_clock::time_point started;
  };
  // Waits (releasing `lock` meanwhile) until no refresh runs, then joins its thread.
  void wait_refresh_locked(std::unique_lock<std::mutex>& lock);
  // For writes into the weights: as wait_refresh_locked, except in GPU memory, where the batch
  // a pre-empted refresh still copies is not waited for (the .cpp says why).
  void wait_refresh_for_writes_locked(std::unique_lock<std::mutex>& lock);
  // Copies (without the lock), then records the outcome under it and wakes the waiters.
  void run_refresh(Refresh& refresh) noexcept;
  // A refresh of `version` is under way: refresh_ says so and no pre-emption is pending. Called
  // once per refresh, when it is asked for (a pre-emption that comes later, even while the first
  // refresh is still making the mirror, stops it).
  void begin_refresh_locked(std::uint64_t version);
  // A refresh ended (`error` empty: it succeeded); the caller wakes the waiters.
  void end_refresh_locked(std::string error);
  // The copy list of a refresh into mirror_ (which exists), and the mirror's claims cleared;
  // `fault`: the failure fail_next_mirror_refresh injected before this refresh was asked for.
  std::unique_ptr<Refresh> prepare_refresh_locked(const std::vector<std::string>& names,
                                                  const CommittedVersion& version,
                                                  std::span<const std::size_t> params,
                                                  std::span<const std::uint64_t> fingerprints,
                                                  std::string fault);
  // A background refresh with no mirror yet, on the worker: makes the mirror (new_mirror,
  // mirror_changing) without the lock, installs it, then runs as run_refresh.
  void first_refresh(std::vector<MirrorParam> layout, const std::vector<std::string>& names,
                     const CommittedVersion& version, const std::vector<std::size_t>& params,
                     const std::vector<std::uint64_t>& fingerprints,
                     const std::string& fault) noexcept;

  ferry_memory_kind_t region_kind_;
  std::map<std::string, Tag> tags_;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::shared_ptr<HostMirror> mirror_;

  // The mirror refresh (guarded by mutex_; refresh_done_ is signalled when one ends).
  MirrorRefreshState refresh_;
  std::condition_variable refresh_done_;
  std::thread refresh_thread_;  // the background refresh's worker, joined by the next wait
  std::string refresh_fault_;
  // Set by preempt_mirror_refresh (with its reason, under mutex_); the worker checks it between
  // batches of copies.
  std::atomic<bool> refresh_preempted_{false};
  std::string preempt_reason_;
};

}  // namespace ferry::store
