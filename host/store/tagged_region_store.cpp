// The bookkeeping shared by every weight store: tags, placement, checked access, release/resume
// order and validation, writers and the host mirror (see store/tagged_region_store.hpp).
#include "store/tagged_region_store.hpp"

#include <algorithm>

#include "common/log.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <atomic>
#include <thread>
#include <utility>

namespace ferry::store {
namespace {

constexpr std::size_t kMaxNameBytes = 1024;

// delay_mirror_refreshes_for_tests's value, in ms.
std::atomic<std::int64_t> test_refresh_delay_ms{0};

// Every tag in `tags` once, in the given order.
std::vector<std::string> unique_tags(std::span<const std::string> tags) {
  std::vector<std::string> out;
  for (const auto& t : tags) {
    bool seen = false;
    for (const auto& o : out) seen = seen || o == t;
    if (!seen) out.push_back(t);
  }
  return out;
}

}  // namespace

void TaggedRegionStore::for_each_region(
    const std::function<void(const std::string&, Region&, bool)>& fn) {
  for (auto& [name, tag] : tags_) {
    for (auto& region : tag.regions) fn(name, region, tag.released);
  }
}

void TaggedRegionStore::replace_mirror_locked(std::shared_ptr<HostMirror> mirror) {
  if (mirror == mirror_) return;
  mirror_changing(mirror_.get(), mirror.get());
  mirror_ = std::move(mirror);
}

TaggedRegionStore::Tag& TaggedRegionStore::tag_locked(const std::string& tag) {
  auto it = tags_.find(tag);
  if (it == tags_.end()) fail(FERRY_STATUS_NOT_FOUND, "weight store has no tag '{}'", tag);
  return it->second;
}

const TaggedRegionStore::Tag& TaggedRegionStore::tag_locked(const std::string& tag) const {
  auto it = tags_.find(tag);
  if (it == tags_.end()) fail(FERRY_STATUS_NOT_FOUND, "weight store has no tag '{}'", tag);
  return it->second;
}

TaggedRegionStore::Tag& TaggedRegionStore::declare_locked(const std::string& tag, Policy policy) {
  if (tag.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "a memory tag must not be empty");
  auto it = tags_.find(tag);
  if (it == tags_.end()) {
    Tag fresh;
    fresh.policy = policy;
    return tags_.emplace(tag, std::move(fresh)).first->second;
  }
  if (it->second.policy != policy) {
    if (it->second.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "cannot change the policy of tag '{}' while it is released", tag);
    }
    // The set of mirrored parameters changes with the policy.
    mirror_layout_changing_locked(tag);
    it->second.policy = policy;
  }
  return it->second;
}

void TaggedRegionStore::set_policy(const std::string& tag, Policy policy) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  declare_locked(tag, policy);
}

void TaggedRegionStore::create_region(const std::string& tag, std::uint64_t bytes, Policy policy) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  Tag& t = declare_locked(tag, policy);
  if (t.released) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "cannot add a region to tag '{}' while it is released",
         tag);
  }
  if (bytes == 0) return;
  const std::uint64_t granularity = region_granularity();
  auto rounded = checked_add(bytes, granularity - 1);
  if (!rounded) fail(FERRY_STATUS_INVALID_ARGUMENT, "region of {} bytes overflows", bytes);
  Region region;
  region.capacity = *rounded / granularity * granularity;
  reserve_region(tag, region);
  t.regions.push_back(std::move(region));
  logger("store")->debug("tag '{}': region of {} bytes at {}", tag, t.regions.back().capacity,
                         static_cast<void*>(t.regions.back().base));
}

void TaggedRegionStore::check_new_param_locked(const std::string& name, ferry_dtype_t dtype,
                                               std::span<const std::uint64_t> shape,
                                               std::uint64_t& bytes,
                                               std::uint64_t& elements) const {
  if (name.empty() || name.size() > kMaxNameBytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter name '{}' is empty or longer than {} bytes",
         name, kMaxNameBytes);
  }
  if (by_name_.count(name) != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter '{}' is already in the weight store", name);
  }
  if (shape.size() > FERRY_MAX_DIMS) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter '{}' has {} dims (max {})", name, shape.size(),
         FERRY_MAX_DIMS);
  }
  auto count = element_count(shape);
  auto size = byte_size(dtype, shape);
  if (!count || !size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter '{}' ({} {}) has no valid byte size", name,
         dtype_name(dtype), shape_string(shape));
  }
  bytes = *size;
  elements = *count;
}

std::size_t TaggedRegionStore::place(const std::string& tag, const std::string& name,
                                     ferry_dtype_t dtype, std::span<const std::uint64_t> shape) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  Tag& t = tag_locked(tag);
  if (t.released) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "cannot place '{}' into tag '{}' while it is released",
         name, tag);
  }
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  check_new_param_locked(name, dtype, shape, bytes, elements);
  if (t.regions.empty()) {
    fail(FERRY_STATUS_NOT_FOUND, "tag '{}' has no region to place '{}' in (create_region first)",
         tag, name);
  }
  for (auto& region : t.regions) {
    const std::uint64_t offset =
        (region.used + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
    if (offset > region.capacity || region.capacity - offset < bytes) continue;
    if (t.policy == Policy::Backup) mirror_layout_changing_locked(tag);
    ParamInfo info;
    info.name = name;
    info.dtype = dtype;
    info.shape.assign(shape.begin(), shape.end());
    info.data = region.base + offset;
    info.bytes = bytes;
    info.elements = elements;
    info.tag = tag;
    info.memory_kind = region_kind_;
    info.block = region.base;
    info.block_bytes = region.capacity;
    region.used = offset + bytes;
    const std::size_t index = params_.size();
    params_.push_back(std::move(info));
    by_name_.emplace(name, index);
    t.params.push_back(index);
    return index;
  }
  fail(FERRY_STATUS_OUT_OF_MEMORY,
       "tag '{}' has no region with room for '{}' ({} bytes); create a larger region", tag, name,
       bytes);
}

std::size_t TaggedRegionStore::register_external(const std::string& tag, const std::string& name,
                                                 ferry_dtype_t dtype,
                                                 std::span<const std::uint64_t> shape, void* data,
                                                 ferry_memory_kind_t kind) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  check_new_param_locked(name, dtype, shape, bytes, elements);
  if (data == nullptr && bytes > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "parameter '{}': engine-owned data pointer is null", name);
  }
  check_external(name, data, bytes, kind);
  auto it = tags_.find(tag);
  Tag& t = it != tags_.end() ? it->second : declare_locked(tag, Policy::Discard);
  if (t.released) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "cannot register '{}' into tag '{}' while it is released", name, tag);
  }
  if (t.policy == Policy::Backup) mirror_layout_changing_locked(tag);
  ParamInfo info;
  info.name = name;
  info.dtype = dtype;
  info.shape.assign(shape.begin(), shape.end());
  info.data = static_cast<std::byte*>(data);
  info.bytes = bytes;
  info.elements = elements;
  info.tag = tag;
  info.external = true;
  info.memory_kind = kind;
  info.block = info.data;
  info.block_bytes = bytes;
  const std::size_t index = params_.size();
  params_.push_back(std::move(info));
  by_name_.emplace(name, index);
  t.params.push_back(index);
  return index;
}

std::size_t TaggedRegionStore::param_count() const {
  std::lock_guard lock(mutex_);
  return params_.size();
}

ParamInfo TaggedRegionStore::param(std::size_t index) const {
  std::lock_guard lock(mutex_);
  if (index >= params_.size()) {
    fail(FERRY_STATUS_NOT_FOUND, "weight store has no parameter #{} (it holds {})", index,
         params_.size());
  }
  return params_[index];
}

std::optional<std::size_t> TaggedRegionStore::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> TaggedRegionStore::tags() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, tag] : tags_) out.push_back(name);
  return out;
}

std::vector<std::size_t> TaggedRegionStore::params_in(const std::string& tag) const {
  std::lock_guard lock(mutex_);
  return tag_locked(tag).params;
}

const ParamInfo& TaggedRegionStore::checked_access_locked(std::size_t index, std::uint64_t offset,
                                                          std::uint64_t bytes,
                                                          const char* what) const {
  if (index >= params_.size()) {
    fail(FERRY_STATUS_NOT_FOUND, "{}: weight store has no parameter #{}", what, index);
  }
  const ParamInfo& p = params_[index];
  if (tag_locked(p.tag).released) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "{} '{}': tag '{}' is released (resume it first)", what,
         p.name, p.tag);
  }
  if (offset > p.bytes || p.bytes - offset < bytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} '{}': bytes [{}, +{}) lie outside its {} bytes", what,
         p.name, offset, bytes, p.bytes);
  }
  return p;
}

void TaggedRegionStore::write(std::size_t index, std::uint64_t offset,
                              std::span<const std::byte> bytes) {
  std::unique_lock lock(mutex_);
  wait_refresh_for_writes_locked(lock);
  const ParamInfo& p = checked_access_locked(index, offset, bytes.size(), "write to");
  if (!bytes.empty()) copy_bytes(p.data + offset, bytes.data(), bytes.size());
}

void TaggedRegionStore::read(std::size_t index, std::uint64_t offset,
                             std::span<std::byte> out) const {
  std::lock_guard lock(mutex_);
  const ParamInfo& p = checked_access_locked(index, offset, out.size(), "read of");
  if (!out.empty()) copy_bytes(out.data(), p.data + offset, out.size());
}

void TaggedRegionStore::release(std::span<const std::string> tags) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  const auto names = unique_tags(tags);
  for (const auto& name : names) {
    const Tag& t = tag_locked(name);
    if (t.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' is already released", name);
    }
    if (!t.writer.empty()) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "tag '{}' cannot be released while {} is writing into it", name, t.writer);
    }
  }
  // Backups first: if one fails nothing has been released yet.
  for (const auto& name : names) {
    Tag& t = tags_.at(name);
    if (t.policy != Policy::Backup) continue;
    save_locked(name);
    if (!t.contents_valid && mirror_) {
      // The mirror now holds invalid (partial) weights: it no longer holds a committed version.
      mirror_->clear_committed(fmt::format(
          "tag '{}' was released while its weights were not valid ({}); the mirror holds that "
          "copy, not a committed version",
          name, t.reason));
    }
  }
  for (const auto& name : names) {
    Tag& t = tags_.at(name);
    drop_memory(name, t.regions);
    t.released = true;
    // Engine-owned parameters: the engine frees (or unmaps) that memory itself after this
    // returns, and maps it again at the same addresses before it resumes the tag; the store
    // only saved it (policy backup) and marks it.
    const auto engine_owned = std::count_if(t.params.begin(), t.params.end(),
                                            [&](std::size_t i) { return params_[i].external; });
    if (engine_owned > 0) {
      logger("store")->info("tag '{}': {} engine-owned parameter(s) are the engine's to free and "
                            "map again at the same addresses",
                            name, engine_owned);
    }
    if (t.policy == Policy::Discard && !t.params.empty()) {
      t.contents_valid = false;
      t.reason = fmt::format(
          "tag '{}' was released with policy discard; its contents are undefined until the next "
          "full update",
          name);
    }
    logger("store")->info("released tag '{}' ({} policy)", name, policy_name(t.policy));
  }
}

void TaggedRegionStore::resume(std::span<const std::string> tags) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  const auto names = unique_tags(tags);
  for (const auto& name : names) {
    if (!tag_locked(name).released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' is not released", name);
    }
  }
  std::vector<std::string> resumed;
  for (const auto& name : names) {
    Tag& t = tags_.at(name);
    try {
      map_memory(name, t.regions);
    } catch (const Error& e) {
      // The failed tag stays released; those before it stay resumed (each tag is consistent).
      if (resumed.empty()) throw;
      std::string before;
      for (const auto& r : resumed) before += (before.empty() ? "'" : ", '") + r + "'";
      fail(e.code(), "{} (tags resumed before the failure: {})", e.what(), before);
    }
    resumed.push_back(name);
    t.released = false;
    logger("store")->info("resumed tag '{}' ({} policy)", name, policy_name(t.policy));
    if (t.policy != Policy::Backup) continue;
    try {
      restore_locked(name);
    } catch (const Error& e) {
      t.contents_valid = false;
      t.reason = fmt::format("tag '{}' was resumed but its backup could not be restored: {}", name,
                             e.what());
      throw;
    }
  }
}

bool TaggedRegionStore::released(const std::string& tag) const {
  std::lock_guard lock(mutex_);
  return tag_locked(tag).released;
}

bool TaggedRegionStore::contents_valid(const std::string& tag) const {
  std::lock_guard lock(mutex_);
  return tag_locked(tag).contents_valid;
}

std::string TaggedRegionStore::invalid_reason(const std::string& tag) const {
  std::lock_guard lock(mutex_);
  const Tag& t = tag_locked(tag);
  return t.contents_valid ? std::string() : t.reason;
}

void TaggedRegionStore::set_contents_valid(const std::string& tag, bool valid, std::string reason) {
  std::lock_guard lock(mutex_);
  Tag& t = tag_locked(tag);
  t.contents_valid = valid;
  t.reason = valid ? std::string() : std::move(reason);
}

std::vector<TagState> TaggedRegionStore::memory_state() const {
  std::lock_guard lock(mutex_);
  std::vector<TagState> out;
  for (const auto& [name, t] : tags_) {
    TagState state;
    state.tag = name;
    for (const auto& region : t.regions) state.bytes += region.capacity;
    for (auto index : t.params) {
      if (params_[index].external) state.external_bytes += params_[index].bytes;
    }
    state.params = t.params.size();
    state.released = t.released;
    state.policy = t.policy;
    state.contents_valid = t.contents_valid;
    state.reason = t.contents_valid ? std::string() : t.reason;
    out.push_back(std::move(state));
  }
  return out;
}

void TaggedRegionStore::begin_writes(std::span<const std::string> tags, const std::string& writer) {
  std::unique_lock lock(mutex_);
  wait_refresh_for_writes_locked(lock);
  const auto names = unique_tags(tags);
  for (const auto& name : names) {
    const Tag& t = tag_locked(name);
    if (t.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "{} cannot write into tag '{}': it is released",
           writer, name);
    }
    if (!t.writer.empty()) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "{} cannot write into tag '{}': {} is writing", writer,
           name, t.writer);
    }
  }
  for (const auto& name : names) tags_.at(name).writer = writer;
}

void TaggedRegionStore::end_writes(std::span<const std::string> tags) noexcept {
  std::lock_guard lock(mutex_);
  for (const auto& name : tags) {
    auto it = tags_.find(name);
    if (it != tags_.end()) it->second.writer.clear();
  }
}

void TaggedRegionStore::mirror_layout_changing_locked(const std::string& tag) {
  if (!mirror_) return;
  if (mirror_->file_backed()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "the layout of tag '{}' cannot change: the file-backed host mirror {} fixes it", tag,
         mirror_->path().string());
  }
  for (const auto& [name, other] : tags_) {
    if (other.policy == Policy::Backup && other.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "the layout of tag '{}' cannot change while tag '{}' has its backup in the host mirror",
           tag, name);
    }
  }
  // The anonymous mirror is rebuilt for the new layout on next use; what it held is dropped
  // (nothing released depends on it, checked above).
  replace_mirror_locked(nullptr);
}

std::vector<MirrorParam> TaggedRegionStore::mirror_layout_locked() const {
  std::vector<MirrorParam> layout;
  for (const auto& p : params_) {
    if (tags_.at(p.tag).policy != Policy::Backup) continue;
    layout.push_back({p.name, p.tag, p.dtype, p.shape});
  }
  return layout;
}

std::vector<MirrorParam> TaggedRegionStore::mirror_layout() const {
  std::lock_guard lock(mutex_);
  return mirror_layout_locked();
}

std::shared_ptr<HostMirror> TaggedRegionStore::mirror() const {
  std::lock_guard lock(mutex_);
  return mirror_;
}

void TaggedRegionStore::attach_mirror(std::shared_ptr<HostMirror> mirror) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  if (!mirror) fail(FERRY_STATUS_INVALID_ARGUMENT, "attach_mirror: null mirror");
  for (const auto& [name, t] : tags_) {
    if (t.policy == Policy::Backup && t.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "cannot replace the host mirror while tag '{}' has its backup in it", name);
    }
  }
  mirror->check_layout(mirror_layout_locked());
  replace_mirror_locked(std::move(mirror));
}

HostMirror& TaggedRegionStore::ensure_mirror_locked() {
  if (!mirror_) replace_mirror_locked(new_mirror(mirror_layout_locked()));
  return *mirror_;
}

void TaggedRegionStore::save_locked(const std::string& tag) {
  const Tag& t = tags_.at(tag);
  HostMirror& mirror = ensure_mirror_locked();
  std::vector<std::size_t> entries;
  std::vector<const std::byte*> sources;
  for (auto index : t.params) {
    auto entry = mirror.find(params_[index].name);
    if (!entry) {
      fail(FERRY_STATUS_INTERNAL, "host mirror has no slot for '{}'", params_[index].name);
    }
    entries.push_back(*entry);
    sources.push_back(params_[index].data);
  }
  save_slots(mirror, entries, sources);
}

void TaggedRegionStore::restore_locked(const std::string& tag) {
  const Tag& t = tags_.at(tag);
  if (!mirror_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}': there is no host mirror to restore from",
         tag);
  }
  std::vector<std::size_t> entries;
  std::vector<std::byte*> targets;
  for (auto index : t.params) {
    auto entry = mirror_->find(params_[index].name);
    if (!entry) {
      fail(FERRY_STATUS_INTERNAL, "host mirror has no slot for '{}'", params_[index].name);
    }
    entries.push_back(*entry);
    targets.push_back(params_[index].data);
  }
  for (auto entry : entries) {
    if (!mirror_->filled(entry)) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "host mirror holds no copy of parameter '{}'",
           mirror_->entries()[entry].param.name);
    }
  }
  restore_slots(*mirror_, entries, targets);
}

void TaggedRegionStore::save_to_mirror(std::span<const std::string> tags) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  const auto names = unique_tags(tags);
  for (const auto& name : names) {
    const Tag& t = tag_locked(name);
    if (t.policy != Policy::Backup) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' has policy discard; it has no mirror copy",
           name);
    }
    if (t.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' is released; nothing to save", name);
    }
  }
  for (const auto& name : names) save_locked(name);
}

void TaggedRegionStore::restore_from_mirror(std::span<const std::string> tags) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  const auto names = unique_tags(tags);
  for (const auto& name : names) {
    const Tag& t = tag_locked(name);
    if (t.policy != Policy::Backup) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' has policy discard; it has no mirror copy",
           name);
    }
    if (t.released) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "tag '{}' is released; resume it first", name);
    }
  }
  for (const auto& name : names) restore_locked(name);
}

void TaggedRegionStore::wait_refresh_locked(std::unique_lock<std::mutex>& lock) {
  if (refresh_.running) {
    ++refresh_.waits;
    refresh_done_.wait(lock, [this] { return !refresh_.running; });
  }
  // The worker records its outcome and wakes us under the lock, and takes the lock no more:
  // joining it here cannot wait for us.
  if (refresh_thread_.joinable()) refresh_thread_.join();
}

void TaggedRegionStore::wait_refresh_for_writes_locked(std::unique_lock<std::mutex>& lock) {
  // A pre-empted refresh still copies the batch it began (at most kRefreshBatchBytes). In GPU
  // memory that copy is a DMA read nothing on the host orders against the update's writes, and
  // the mirror never claims what it copied: the writes need not wait (on an H200 the wait would
  // add up to ~1 ms to every update that pre-empts). In host memory it is a memcpy reading what
  // the writer's thread writes, a data race: the writes wait for it.
  if (region_kind_ == FERRY_MEMORY_CUDA && refresh_.running && refresh_preempted_.load()) return;
  wait_refresh_locked(lock);
}

void TaggedRegionStore::preempt_mirror_refresh(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (!refresh_.running || refresh_preempted_.load()) return;
  preempt_reason_ = reason;
  refresh_preempted_.store(true);
}

void TaggedRegionStore::join_mirror_refresh() noexcept {
  try {
    std::unique_lock lock(mutex_);
    wait_refresh_locked(lock);
  } catch (...) {
    // A lock or join that fails leaves nothing better to do in a destructor.
  }
}

void TaggedRegionStore::refresh_mirror(std::span<const std::string> tags,
                                       const CommittedVersion& version,
                                       std::span<const std::size_t> params,
                                       std::span<const std::uint64_t> fingerprints,
                                       bool background) {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  std::unique_ptr<Refresh> refresh;
  try {
    auto names = unique_tags(tags);
    for (const auto& name : names) {
      const Tag& t = tag_locked(name);
      if (t.policy != Policy::Backup) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "refresh of the host mirror: tag '{}' has policy discard; it has no mirror copy", name);
      }
      if (t.released) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "refresh of the host mirror: tag '{}' is released; nothing to copy", name);
      }
    }
    if (params.size() != fingerprints.size()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "refresh of the host mirror: {} parameters but {} fingerprints", params.size(),
           fingerprints.size());
    }
    for (auto index : params) {
      if (index >= params_.size()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "refresh of the host mirror: no parameter #{} (the store holds {})", index,
             params_.size());
      }
    }
    if (!mirror_ && background) {
      // The first refresh makes the mirror, which a CUDA store page-locks (~1.2 s for 4.4 GB
      // on an H100): on the worker, so that the publish asking for it does not wait. Whatever
      // would touch the mirror meanwhile waits for the refresh, as it waits for any.
      begin_refresh_locked(version.number);
      refresh_thread_ = std::thread(
          [this, layout = mirror_layout_locked(), names = std::move(names), version,
           fault = std::exchange(refresh_fault_, std::string()),
           params = std::vector<std::size_t>(params.begin(), params.end()),
           fingerprints = std::vector<std::uint64_t>(fingerprints.begin(), fingerprints.end())]() mutable {
            first_refresh(std::move(layout), names, version, params, fingerprints, fault);
          });
      return;
    }
    ensure_mirror_locked();
    refresh = prepare_refresh_locked(names, version, params, fingerprints,
                                     std::exchange(refresh_fault_, std::string()));
    begin_refresh_locked(version.number);
    if (background) {
      refresh_thread_ = std::thread([this, job = std::move(refresh)] { run_refresh(*job); });
    }
  } catch (const std::exception& e) {
    if (mirror_) {
      mirror_->clear_committed(
          fmt::format("the copy of version {} into the mirror could not start: {}",
                      version.number, e.what()));
    }
    refresh_.running = false;
    refresh_.version = version.number;
    refresh_.failed = true;
    refresh_.error = e.what();
    throw;
  }
  if (!background) {
    lock.unlock();
    run_refresh(*refresh);
  }
}

std::unique_ptr<TaggedRegionStore::Refresh> TaggedRegionStore::prepare_refresh_locked(
    const std::vector<std::string>& names, const CommittedVersion& version,
    std::span<const std::size_t> params, std::span<const std::uint64_t> fingerprints,
    std::string fault) {
  HostMirror& mirror = *mirror_;
  auto refresh = std::make_unique<Refresh>();
  refresh->mirror = mirror_;
  refresh->version = version;
  refresh->fingerprints.assign(mirror.entries().size(), 0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (auto entry = mirror.find(params_[params[i]].name)) {
      refresh->fingerprints[*entry] = fingerprints[i];
    }
  }
  for (const auto& name : names) {
    for (auto index : tags_.at(name).params) {
      auto entry = mirror.find(params_[index].name);
      if (!entry) {
        fail(FERRY_STATUS_INTERNAL, "host mirror has no slot for '{}'", params_[index].name);
      }
      refresh->entries.push_back(*entry);
      refresh->copies.push_back(
          {mirror.slot(*entry), params_[index].data, mirror.entries()[*entry].bytes});
    }
  }
  refresh->fault = std::move(fault);
  // From here until the last byte landed the mirror claims nothing: not the old version (its
  // slots are being overwritten), not the new one (not all there yet).
  mirror.clear_committed(fmt::format(
      "the copy of version {} into the mirror began and did not end (its receiver stopped "
      "during the copy)",
      version.number));
  for (auto entry : refresh->entries) mirror.clear_filled(entry);
  refresh->started = std::chrono::steady_clock::now();
  return refresh;
}

void TaggedRegionStore::begin_refresh_locked(std::uint64_t version) {
  refresh_.running = true;
  refresh_.version = version;
  refresh_.failed = false;
  refresh_.error.clear();
  refresh_preempted_.store(false);
  preempt_reason_.clear();
}

void TaggedRegionStore::end_refresh_locked(std::string error) {
  refresh_.running = false;
  refresh_.failed = !error.empty();
  refresh_.error = std::move(error);
  refresh_.finished += 1;
}

void TaggedRegionStore::first_refresh(std::vector<MirrorParam> layout,
                                      const std::vector<std::string>& names,
                                      const CommittedVersion& version,
                                      const std::vector<std::size_t>& params,
                                      const std::vector<std::uint64_t>& fingerprints,
                                      const std::string& fault) noexcept {
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  std::shared_ptr<HostMirror> made;
  try {
    made = new_mirror(std::move(layout));
    // Without the lock: no one else reaches the mirror (or the pinning state) while a refresh
    // runs, and the new mirror is no one's yet.
    mirror_changing(nullptr, made.get());
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::unique_ptr<Refresh> job;
  {
    std::lock_guard lock(mutex_);
    try {
      if (error.empty()) {
        mirror_ = made;
        job = prepare_refresh_locked(names, version, params, fingerprints, fault);
        job->started = start;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!job) {
      if (mirror_) {
        mirror_->clear_committed(fmt::format(
            "the copy of version {} into the mirror could not start: {}", version.number, error));
      }
      end_refresh_locked(error);
      try {
        logger("store")->warn(
            "the host mirror for version {} could not be made: {}; the mirror holds no "
            "committed weights until the next refresh",
            version.number, error);
      } catch (...) {
      }
      refresh_done_.notify_all();
      return;
    }
  }
  run_refresh(*job);
}

void TaggedRegionStore::run_refresh(Refresh& refresh) noexcept {
  std::string error;
  try {
    if (!refresh.fault.empty()) fail(FERRY_STATUS_INTERNAL, "{}", refresh.fault);
    const auto hold_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(test_refresh_delay_ms.load());
    while (std::chrono::steady_clock::now() < hold_until && !refresh_preempted_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // In batches, so that an update that begins meanwhile (preempt_mirror_refresh) waits for at
    // most one batch in flight, not for the whole copy.
    std::vector<CopyJob> batch;
    std::uint64_t in_batch = 0;
    auto flush = [&] {
      if (batch.empty()) return;
      if (refresh_preempted_.load()) {
        std::lock_guard lock(mutex_);
        fail(FERRY_STATUS_ABORTED, "pre-empted: {}", preempt_reason_);
      }
      copy_to_mirror(batch);
      batch.clear();
      in_batch = 0;
    };
    for (const auto& job : refresh.copies) {
      for (std::uint64_t at = 0; at < job.bytes;) {
        const std::uint64_t n = std::min(kRefreshBatchBytes - in_batch, job.bytes - at);
        batch.push_back({static_cast<std::byte*>(job.dst) + at,
                         static_cast<const std::byte*>(job.src) + at, n});
        at += n;
        in_batch += n;
        if (in_batch == kRefreshBatchBytes) flush();
      }
    }
    flush();
    if (refresh_preempted_.load()) {
      std::lock_guard lock(mutex_);
      fail(FERRY_STATUS_ABORTED, "pre-empted: {}", preempt_reason_);
    }
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - refresh.started).count();
  std::lock_guard lock(mutex_);
  HostMirror& mirror = *refresh.mirror;
  if (error.empty()) {
    try {
      for (auto entry : refresh.entries) mirror.mark_filled(entry);
      mirror.set_committed(refresh.version, refresh.fingerprints);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!error.empty()) {
    mirror.clear_committed(fmt::format("the copy of version {} into the mirror did not end: {}",
                                       refresh.version.number, error));
  }
  end_refresh_locked(error);
  refresh_.last_seconds = seconds;
  try {
    std::uint64_t bytes = 0;
    for (const auto& c : refresh.copies) bytes += c.bytes;
    if (error.empty()) {
      logger("store")->debug("host mirror holds version {}: {} parameters, {} bytes in {:.3f} ms",
                             refresh.version.number, refresh.copies.size(), bytes,
                             seconds * 1e3);
    } else if (refresh_preempted_.load()) {
      // A normal event where updates come faster than the mirror copies.
      logger("store")->debug(
          "refresh of the host mirror with version {} stopped after {:.3f} ms: {}; the mirror "
          "holds no committed weights until the next refresh",
          refresh.version.number, seconds * 1e3, error);
    } else {
      logger("store")->warn(
          "refresh of the host mirror with version {} failed: {}; the mirror holds no committed "
          "weights until the next refresh",
          refresh.version.number, error);
    }
  } catch (...) {
    // Logging is best effort; the outcome is in refresh_.
  }
  refresh_done_.notify_all();
}

MirrorRefreshState TaggedRegionStore::wait_for_mirror_refresh() {
  std::unique_lock lock(mutex_);
  wait_refresh_locked(lock);
  return refresh_;
}

MirrorRefreshState TaggedRegionStore::mirror_refresh_state() const {
  std::lock_guard lock(mutex_);
  return refresh_;
}

void TaggedRegionStore::delay_mirror_refreshes_for_tests(std::chrono::milliseconds delay) {
  test_refresh_delay_ms.store(delay.count());
}

void TaggedRegionStore::fail_next_mirror_refresh(std::string error) {
  std::lock_guard lock(mutex_);
  refresh_fault_ = error.empty() ? std::string("injected mirror refresh failure") : std::move(error);
}

}  // namespace ferry::store
