// The update engine: buckets -> validated manifests -> cached plans -> CPU scatter -> commit,
// with rollback from the host mirror or fencing on failure (see update/update_engine.hpp).
#include "update/update_engine.hpp"

#include "common/log.hpp"
#include "store/host_mirror.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <chrono>

namespace ferry::update {
namespace {

constexpr std::uint64_t kScaleBlock = 128;  // FP8 block quantization: 128 x 128 blocks

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

UpdateEngine::UpdateEngine(store::WeightStore& store, PlanProvider& plans, UpdateOptions options)
    : store_(store), plans_(plans), options_(options), cache_(options.plan_cache_capacity) {}

UpdateEngine::~UpdateEngine() {
  std::lock_guard lock(op_mutex_);
  bool active = false;
  {
    std::lock_guard state(state_mutex_);
    active = active_;
  }
  if (active) fail_locked("at shutdown", "the update engine was destroyed during the update");
}

void UpdateEngine::bind_layout_locked() {
  const auto& layout = plans_.layout();
  std::vector<Target> targets;
  std::vector<std::string> tags;
  std::vector<std::string> missing;
  targets.reserve(layout.size());
  for (const auto& param : layout) {
    auto index = store_.find(param.name);
    if (!index) {
      missing.push_back(param.name);
      continue;
    }
    store::ParamInfo info = store_.param(*index);
    if (info.dtype != param.dtype || info.shape != param.shape) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "parameter '{}' is {} {} in the weight store but {} {} in the model layout",
           param.name, dtype_name(info.dtype), shape_string(info.shape), dtype_name(param.dtype),
           shape_string(param.shape));
    }
    Target target;
    target.store_index = *index;
    target.view = {info.data, info.dtype, info.elements};
    target.bytes = info.bytes;
    target.tag = info.tag;
    bool known = false;
    for (const auto& t : tags) known = known || t == info.tag;
    if (!known) tags.push_back(info.tag);
    targets.push_back(std::move(target));
  }
  if (!missing.empty()) {
    std::string names;
    for (std::size_t i = 0; i < missing.size() && i < options_.missing_names_listed; ++i) {
      names += (i ? ", " : "") + missing[i];
    }
    fail(FERRY_STATUS_NOT_FOUND, "{} layout parameters are not in the weight store: {}{}",
         missing.size(), names,
         missing.size() > options_.missing_names_listed
             ? fmt::format(" (and {} more)", missing.size() - options_.missing_names_listed)
             : std::string());
  }
  targets_ = std::move(targets);
  layout_tags_ = std::move(tags);
  {
    std::lock_guard state(state_mutex_);
    health_tags_ = layout_tags_;
  }
  written_.assign(targets_.size(), WrittenRanges{});
}

void UpdateEngine::begin(std::uint64_t version, std::string label) {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "cannot begin update {}: update {} is still active (commit or abort it first)", version,
           active_version_);
    }
  }
  bind_layout_locked();
  store_.begin_writes(layout_tags_, fmt::format("update {}", version));
  for (std::size_t i = 0; i < targets_.size(); ++i) written_[i].reset(targets_[i].view.elements);
  expected_.clear();
  buckets_this_update_ = 0;
  current_bucket_.reset();
  std::lock_guard state(state_mutex_);
  active_ = true;
  dirty_ = false;
  active_version_ = version;
  active_label_ = std::move(label);
  logger("update")->info("update {} begins ({} parameters)", version, targets_.size());
}

void UpdateEngine::record_written(const ferry_plan_op_t& op) {
  written_[op.dst_param].add_block(op.dst_offset, op.dst_row_stride, op.rows, op.cols);
  if (op.transform != FERRY_TRANSFORM_FP8_BLOCK_QUANT || op.dst_row_stride == 0) return;
  // The op also writes the scales of every 128 x 128 block it touches.
  const std::uint64_t row0 = op.dst_offset / op.dst_row_stride;
  const std::uint64_t col0 = op.dst_offset % op.dst_row_stride;
  const std::uint64_t scale_cols = ceil_div(op.dst_row_stride, kScaleBlock);
  const std::uint64_t block_row0 = row0 / kScaleBlock;
  const std::uint64_t block_col0 = col0 / kScaleBlock;
  const std::uint64_t block_rows = ceil_div(row0 + op.rows, kScaleBlock) - block_row0;
  const std::uint64_t block_cols = ceil_div(col0 + op.cols, kScaleBlock) - block_col0;
  written_[op.scale_param].add_block(block_row0 * scale_cols + block_col0, scale_cols, block_rows,
                                     block_cols);
}

void UpdateEngine::apply_bucket(std::span<const std::byte> bucket,
                                std::span<const std::uint8_t> manifest_bytes) {
  std::lock_guard lock(op_mutex_);
  std::uint64_t version = 0;
  {
    std::lock_guard state(state_mutex_);
    if (!active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "apply_bucket: no update is active (call begin first)");
    }
    version = active_version_;
  }
  const auto started = std::chrono::steady_clock::now();
  current_bucket_.reset();
  try {
    const manifest::Manifest m = manifest::decode(manifest_bytes);
    current_bucket_ = m.bucket_index;
    if (m.bucket_count == 0) {
      fail(FERRY_STATUS_CORRUPT_DATA, "the manifest is a catalog (bucket_count 0), not a bucket");
    }
    if (m.bucket_bytes != bucket.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "the manifest describes {} bucket bytes but {} arrived",
           m.bucket_bytes, bucket.size());
    }
    if (m.version != 0 && m.version != version) {
      fail(FERRY_STATUS_CORRUPT_DATA, "the bucket belongs to update {}, not to the active update",
           m.version);
    }
    std::vector<kernels::EntryView> entries;
    entries.reserve(m.tensors.size());
    for (const auto& e : m.tensors) {
      const auto end = checked_add(e.offset, e.size);
      const auto count = element_count(e.shape);
      if (!end || *end > bucket.size() || !count) {
        fail(FERRY_STATUS_CORRUPT_DATA, "tensor '{}' lies outside the bucket", e.name);
      }
      entries.push_back({bucket.data() + e.offset, e.dtype, *count});
    }
    if (options_.verify_fingerprints) {
      for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const auto& e = m.tensors[i];
        if (!e.fingerprint) continue;
        const std::uint64_t actual = kernels::fingerprint_cpu(entries[i].data, e.size, options_.threads);
        if (actual != *e.fingerprint) {
          fail(FERRY_STATUS_CORRUPT_DATA,
               "tensor '{}': fingerprint of the received bytes {:016x} differs from the sender's "
               "{:016x}",
               e.name, actual, *e.fingerprint);
        }
      }
    }
    const PlanOps ops = cache_.get(m, plans_);
    for (std::size_t i = 0; i < ops->size(); ++i) {
      const auto& op = (*ops)[i];
      const bool fp8 = op.transform == FERRY_TRANSFORM_FP8_BLOCK_QUANT;
      if (op.src_tensor >= entries.size() || op.dst_param >= targets_.size() ||
          (fp8 && op.scale_param >= targets_.size())) {
        fail(FERRY_STATUS_INTERNAL,
             "plan op #{} names entry {} / parameter {} outside the bucket ({} entries) or the "
             "layout ({} parameters)",
             i, op.src_tensor, op.dst_param, entries.size(), targets_.size());
      }
    }
    std::vector<kernels::ParamView> views;
    views.reserve(targets_.size());
    for (const auto& t : targets_) views.push_back(t.view);
    if (!ops->empty()) {
      std::lock_guard state(state_mutex_);
      dirty_ = true;
    }
    kernels::scatter_cpu(*ops, entries, views, options_.threads);
    for (const auto& op : *ops) record_written(op);
    ++buckets_this_update_;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::lock_guard state(state_mutex_);
    metrics_.buckets_applied += 1;
    metrics_.bytes_applied += bucket.size();
    metrics_.seconds_applying += seconds;
    metrics_.plan_cache_hits = cache_.hits();
    metrics_.plan_cache_misses = cache_.misses();
  } catch (const std::exception& e) {
    const std::string where =
        current_bucket_ ? fmt::format("at bucket {}", *current_bucket_)
                        : fmt::format("at bucket #{} (manifest unreadable)", buckets_this_update_);
    fail_locked(where, e.what());
    throw;
  } catch (...) {
    fail_locked(fmt::format("at bucket #{}", buckets_this_update_), "unknown exception");
    throw;
  }
}

void UpdateEngine::set_expected_fingerprints(std::map<std::string, std::uint64_t> expected) {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (!active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "set_expected_fingerprints: no update is active (call begin first)");
    }
  }
  expected_ = std::move(expected);
}

std::vector<std::uint64_t> UpdateEngine::fingerprint_params_locked(
    const std::vector<Target>& targets) const {
  std::vector<std::uint64_t> out;
  out.reserve(targets.size());
  for (const auto& t : targets) {
    out.push_back(kernels::fingerprint_cpu(t.view.data, t.bytes, options_.threads));
  }
  return out;
}

void UpdateEngine::commit() {
  std::lock_guard lock(op_mutex_);
  WeightVersion next;
  {
    std::lock_guard state(state_mutex_);
    if (!active_) fail(FERRY_STATUS_FAILED_PRECONDITION, "commit: no update is active");
    next = {true, active_version_, active_label_};
  }
  std::vector<std::uint64_t> fps;
  try {
    const auto& layout = plans_.layout();
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      if (!written_[i].complete()) missing.push_back(layout[i].name);
    }
    if (!missing.empty()) {
      std::string names;
      for (std::size_t i = 0; i < missing.size() && i < options_.missing_names_listed; ++i) {
        names += (i ? ", " : "") + missing[i];
      }
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{} of {} parameters were not fully written: {}{}", missing.size(), targets_.size(),
           names,
           missing.size() > options_.missing_names_listed
               ? fmt::format(" (and {} more)", missing.size() - options_.missing_names_listed)
               : std::string());
    }
    fps = fingerprint_params_locked(targets_);
    for (const auto& [name, expected] : expected_) {
      std::optional<std::size_t> index;
      for (std::size_t i = 0; i < layout.size() && !index; ++i) {
        if (layout[i].name == name) index = i;
      }
      if (!index) {
        fail(FERRY_STATUS_NOT_FOUND,
             "the sender sent a fingerprint for '{}', which is not a parameter of the layout", name);
      }
      if (fps[*index] != expected) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "parameter '{}': receiver fingerprint {:016x} differs from the sender's {:016x}", name,
             fps[*index], expected);
      }
    }
  } catch (const std::exception& e) {
    fail_locked("at commit", e.what());
    throw;
  } catch (...) {
    fail_locked("at commit", "unknown exception");
    throw;
  }
  publish_locked(next, std::move(fps), true);
  {
    std::lock_guard state(state_mutex_);
    metrics_.updates_committed += 1;
  }
  logger("update")->info("update {} committed ({} buckets)", next.number, buckets_this_update_);
  finish_locked();
}

void UpdateEngine::abort(const std::string& reason) {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (!active_) return;
  }
  fail_locked(current_bucket_ ? fmt::format("after bucket {}", *current_bucket_)
                              : std::string("before any bucket"),
              reason);
}

bool UpdateEngine::mirror_holds_published_locked() const {
  WeightVersion published;
  {
    std::lock_guard state(state_mutex_);
    published = published_;
  }
  if (!published.committed || !all_tags_backup_locked()) return false;
  const auto mirror = store_.mirror();
  if (!mirror) return false;
  const auto committed = mirror->committed();
  if (!committed || committed->number != published.number) return false;
  for (const auto& t : targets_) {
    const auto entry = mirror->find(store_.param(t.store_index).name);
    if (!entry || !mirror->filled(*entry)) return false;
  }
  return true;
}

bool UpdateEngine::all_tags_backup_locked() const {
  const auto states = store_.memory_state();
  for (const auto& tag : layout_tags_) {
    bool backup = false;
    for (const auto& s : states) backup = backup || (s.tag == tag && s.policy == store::Policy::Backup);
    if (!backup) return false;
  }
  return !layout_tags_.empty();
}

void UpdateEngine::refresh_mirror_locked(const WeightVersion& version,
                                         const std::vector<std::uint64_t>& fingerprints) {
  if (auto old = store_.mirror()) old->clear_committed();
  store_.save_to_mirror(layout_tags_);
  const auto mirror = store_.mirror();
  if (!mirror) fail(FERRY_STATUS_INTERNAL, "the store created no host mirror");
  std::vector<std::uint64_t> per_entry(mirror->entries().size(), 0);
  const auto& layout = plans_.layout();
  for (std::size_t i = 0; i < targets_.size(); ++i) {
    if (auto entry = mirror->find(layout[i].name)) per_entry[*entry] = fingerprints[i];
  }
  mirror->set_committed({version.number, version.label}, per_entry);
}

void UpdateEngine::publish_locked(const WeightVersion& version,
                                  std::vector<std::uint64_t> fingerprints, bool refresh_mirror) {
  if (refresh_mirror && all_tags_backup_locked()) {
    try {
      refresh_mirror_locked(version, fingerprints);
    } catch (const std::exception& e) {
      // The live weights are complete and verified; only the rollback copy is missing.
      if (auto mirror = store_.mirror()) mirror->clear_committed();
      logger("update")->error("version {} published without a host mirror copy: {}",
                              version.number, e.what());
    }
  }
  for (const auto& tag : layout_tags_) store_.set_contents_valid(tag, true, {});
  const auto& layout = plans_.layout();
  std::map<std::string, std::uint64_t> by_name;
  for (std::size_t i = 0; i < fingerprints.size() && i < layout.size(); ++i) {
    by_name[layout[i].name] = fingerprints[i];
  }
  std::lock_guard state(state_mutex_);
  published_ = version;
  fence_.reset();
  fingerprints_ = std::move(by_name);
}

void UpdateEngine::fence_locked(const std::string& reason) noexcept {
  try {
    logger("update")->error("fenced: {}", reason);
    for (const auto& tag : layout_tags_) store_.set_contents_valid(tag, false, reason);
  } catch (...) {
    // The fence below is what health() reports; the store flag is secondary.
  }
  std::lock_guard state(state_mutex_);
  try {
    fence_ = reason;
  } catch (...) {
    fence_ = std::string();
  }
}

void UpdateEngine::fail_locked(const std::string& where, const std::string& why) noexcept {
  bool dirty = false;
  std::uint64_t version = 0;
  {
    std::lock_guard state(state_mutex_);
    dirty = dirty_;
    version = active_version_;
    metrics_.updates_aborted += 1;
  }
  try {
    const std::string reason = fmt::format("update {} aborted {}: {}", version, where, why);
    if (!dirty) {
      logger("update")->warn("{}; no weight was written", reason);
    } else if (mirror_holds_published_locked()) {
      try {
        store_.restore_from_mirror(layout_tags_);
        std::lock_guard state(state_mutex_);
        metrics_.rollbacks += 1;
        logger("update")->warn("{}; weights rolled back from the host mirror to version {}",
                               reason, published_.number);
      } catch (const std::exception& e) {
        fence_locked(fmt::format("{}; rollback from the host mirror failed: {}", reason, e.what()));
      }
    } else {
      fence_locked(reason + "; weights are partial until a full update or disk reload succeeds");
    }
  } catch (...) {
    fence_locked("an update was aborted and its cleanup failed; weights may be partial");
  }
  finish_locked();
}

void UpdateEngine::finish_locked() noexcept {
  store_.end_writes(layout_tags_);
  std::lock_guard state(state_mutex_);
  active_ = false;
  dirty_ = false;
}

void UpdateEngine::restore_from_mirror() {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "cannot restore from the host mirror while update {} is active", active_version_);
    }
  }
  bind_layout_locked();
  const auto mirror = store_.mirror();
  const auto committed = mirror ? mirror->committed() : std::nullopt;
  if (!committed) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "the host mirror holds no committed weights");
  }
  if (!all_tags_backup_locked()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "restore from the host mirror needs policy backup on every tag of the layout");
  }
  store_.begin_writes(layout_tags_, "restore from the host mirror");
  std::vector<std::uint64_t> fps;
  try {
    store_.restore_from_mirror(layout_tags_);
    fps = fingerprint_params_locked(targets_);
    const auto& layout = plans_.layout();
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      const auto entry = mirror->find(layout[i].name);
      if (!entry || mirror->fingerprint(*entry) != fps[i]) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "host mirror: parameter '{}' does not match the fingerprint recorded for version {}",
             layout[i].name, committed->number);
      }
    }
  } catch (const std::exception& e) {
    fence_locked(fmt::format("restore of version {} from the host mirror failed: {}",
                             committed->number, e.what()));
    store_.end_writes(layout_tags_);
    throw;
  }
  publish_locked({true, committed->number, committed->label}, std::move(fps), false);
  store_.end_writes(layout_tags_);
  logger("update")->info("version {} restored from the host mirror", committed->number);
}

void UpdateEngine::adopt_current(std::uint64_t version, std::string label) {
  std::lock_guard lock(op_mutex_);
  {
    std::lock_guard state(state_mutex_);
    if (active_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "cannot adopt version {} while update {} is active",
           version, active_version_);
    }
  }
  bind_layout_locked();
  store_.begin_writes(layout_tags_, fmt::format("adopt version {}", version));
  try {
    auto fps = fingerprint_params_locked(targets_);
    publish_locked({true, version, std::move(label)}, std::move(fps), true);
  } catch (...) {
    store_.end_writes(layout_tags_);
    throw;
  }
  store_.end_writes(layout_tags_);
}

void UpdateEngine::set_version_label(std::string label) {
  std::lock_guard lock(op_mutex_);
  WeightVersion published;
  {
    std::lock_guard state(state_mutex_);
    if (!published_.committed) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "no version is published yet; nothing to relabel");
    }
    published_.label = label;
    published = published_;
  }
  // Keep the mirror's record (used after a restart) in step with the published label.
  if (auto mirror = store_.mirror()) {
    auto committed = mirror->committed();
    if (committed && committed->number == published.number) {
      std::vector<std::uint64_t> fps;
      for (std::size_t i = 0; i < mirror->entries().size(); ++i) fps.push_back(mirror->fingerprint(i));
      mirror->set_committed({published.number, published.label}, fps);
    }
  }
}

WeightVersion UpdateEngine::version() const {
  std::lock_guard state(state_mutex_);
  return published_;
}

bool UpdateEngine::active() const {
  std::lock_guard state(state_mutex_);
  return active_;
}

UpdateMetrics UpdateEngine::metrics() const {
  std::lock_guard state(state_mutex_);
  UpdateMetrics out = metrics_;
  out.fenced = fence_.has_value();
  return out;
}

std::map<std::string, std::uint64_t> UpdateEngine::fingerprints() const {
  std::lock_guard state(state_mutex_);
  return fingerprints_;
}

Health UpdateEngine::health() const {
  std::vector<std::string> tags;
  {
    std::lock_guard state(state_mutex_);
    if (fence_) return {false, *fence_};
    if (active_ && dirty_) {
      return {false, fmt::format("update {} is being applied to the live weights", active_version_)};
    }
    if (!published_.committed) return {false, "no weights committed yet"};
    tags = health_tags_;
  }
  try {
    for (const auto& tag : tags) {
      if (store_.released(tag)) {
        return {false, fmt::format("tag '{}' is released; resume it to serve", tag)};
      }
      if (!store_.contents_valid(tag)) return {false, store_.invalid_reason(tag)};
    }
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
  return {true, {}};
}

}  // namespace ferry::update
