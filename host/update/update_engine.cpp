// update/update_engine.cpp: the update engine's transaction: binding the layout, begin, commit
// (coverage, fingerprints, publication), abort with rollback from the host mirror or fencing,
// the mirror's refresh after a commit (in the background by default), restore and adopt, and the
// state any thread may read (see update/update_engine.hpp). Applying a bucket:
// update_apply.cpp; buckets written in place: update_direct.cpp.
#include "update/update_engine.hpp"

#include "common/log.hpp"
#include "store/host_mirror.hpp"
#include "update/cuda_apply.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <chrono>
#include <string_view>
#include <unordered_map>

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
  // A refresh this engine started ends before the engine does (the store joins it too).
  try {
    (void)store_.wait_for_mirror_refresh();
  } catch (...) {
    // Nothing to do about it at shutdown.
  }
}

store::MirrorRefreshState UpdateEngine::wait_for_mirror_locked() {
  return store_.wait_for_mirror_refresh();
}

void UpdateEngine::bind_layout_locked() {
  // A placed parameter never moves or changes (both stores keep its address through release and
  // resume), so a binding holds while the store has the same parameters: only the first bind and
  // one after the store grew walk the layout (~0.3 us per parameter, at every begin).
  const std::size_t param_count = store_.param_count();
  if (bound_param_count_ && *bound_param_count_ == param_count) {
    // begin() resets each entry; kept entries keep their storage (no allocation per parameter
    // per update).
    if (written_.size() != targets_.size()) written_.assign(targets_.size(), WrittenRanges{});
    return;
  }
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
    target.device = info.memory_kind == FERRY_MEMORY_CUDA;
    target.block = info.block;
    target.block_bytes = info.block_bytes;
#if !FERRY_UPDATE_HAVE_CUDA
    if (target.device) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "parameter '{}' is in CUDA memory but this build has no CUDA support (-Dcuda)",
           param.name);
    }
#endif
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
  // Device op tables hold parameter addresses: drop them when an address changed.
  std::vector<const std::byte*> addresses;
  addresses.reserve(targets.size());
  for (const auto& t : targets) addresses.push_back(t.view.data);
  if (addresses != bound_addresses_) {
    cache_.clear_attachments();
    bound_addresses_ = std::move(addresses);
  }
  targets_ = std::move(targets);
  layout_tags_ = std::move(tags);
  {
    std::lock_guard state(state_mutex_);
    health_tags_ = layout_tags_;
  }
  written_.assign(targets_.size(), WrittenRanges{});
  bound_param_count_ = param_count;
  ++bindings_;
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
    // Versions only increase (every update path begins here): a repeated or older number would
    // make two different sets of weights answer to one version.
    if (published_.committed && version <= published_.number) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "update version {} is not newer than the published version {} ('{}'): versions only "
           "increase; send a version above {}",
           version, published_.number, published_.label, published_.number);
    }
  }
  // The mirror refresh of the last commit reads the weights, and a failure of this update rolls
  // back from it. By default an update that comes before it ended pre-empts it (the store then
  // lets the writes begin; the mirror holds no version, so a failure of this update fences); with
  // MirrorRefreshMode::complete the copy must have landed first. Here, not later: a session says
  // Ready once begin (and begin_direct_writes) returned, and from then on a direct-writing sender
  // writes device memory without asking the engine.
  if (options_.mirror_refresh == MirrorRefreshMode::background) {
    store_.preempt_mirror_refresh(fmt::format(
        "update {} began before the host mirror finished copying version {}", version,
        this->version().number));
  } else {
    (void)wait_for_mirror_locked();
  }
  bind_layout_locked();
  store_.begin_writes(layout_tags_, fmt::format("update {}", version));
  for (std::size_t i = 0; i < targets_.size(); ++i) written_[i].reset(targets_[i].view.elements);
  in_place_.clear();
  read_checks_.clear();
  expected_.clear();
  buckets_this_update_ = 0;
  current_bucket_.reset();
  std::lock_guard state(state_mutex_);
  active_ = true;
  dirty_ = false;
  direct_writes_ = false;
  writer_fingerprints_ = false;
  active_version_ = version;
  active_label_ = std::move(label);
  begun_at_ = std::chrono::steady_clock::now();
  bytes_at_begin_ = metrics_.bytes_applied;
  logger("update")->info("update {} begins ({} parameters)", version, targets_.size());
}

void UpdateEngine::set_label(std::string label) {
  std::lock_guard state(state_mutex_);
  if (!active_) fail(FERRY_STATUS_FAILED_PRECONDITION, "set_label: no update is active");
  active_label_ = std::move(label);
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

bool UpdateEngine::has_device_targets_locked() const {
  for (const auto& t : targets_) {
    if (t.device) return true;
  }
  return false;
}

CudaApplier& UpdateEngine::cuda_locked() {
#if FERRY_UPDATE_HAVE_CUDA
  if (!cuda_) {
    int device = 0;
    for (const auto& t : targets_) {
      if (t.device) {
        device = CudaApplier::device_of(t.view.data);
        break;
      }
    }
    cuda_ = std::make_shared<CudaApplier>(device);
  }
  return *cuda_;
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "this build has no CUDA support (-Dcuda)");
#endif
}

void UpdateEngine::synchronize_device_locked() {
  if (cuda_) cuda_->synchronize();
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
    const std::vector<Target>& targets) {
  std::vector<std::uint64_t> out(targets.size(), 0);
  std::vector<std::size_t> on_device;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].device) {
      on_device.push_back(i);
    } else {
      out[i] = kernels::fingerprint_cpu(targets[i].view.data, targets[i].bytes, options_.threads);
    }
  }
  if (!on_device.empty()) {
    std::vector<const std::byte*> data;
    std::vector<std::uint64_t> bytes;
    for (std::size_t i : on_device) {
      data.push_back(targets[i].view.data);
      bytes.push_back(targets[i].bytes);
    }
    const auto values = cuda_locked().fingerprints(data, bytes);
    for (std::size_t k = 0; k < on_device.size(); ++k) out[on_device[k]] = values[k];
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
  // Phase ends for --log-level debug: coverage, fingerprints, checks, publish.
  using Clock = std::chrono::steady_clock;
  const auto commit_start = Clock::now();
  commit_reads_ = {};
  Clock::time_point covered_at;
  Clock::time_point printed_at;
  Clock::time_point checked_at;
  try {
    synchronize_device_locked();  // every scatter of the update has finished (or failed)
    verify_read_in_place_locked();
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
    covered_at = Clock::now();
    {
      // What was written in place is verified now, in one pass; parameters written whole that
      // way need no second read.
      const auto known = verify_in_place_locked();
      std::vector<Target> unknown;
      std::vector<std::size_t> unknown_index;
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        if (known[i]) continue;
        unknown.push_back(targets_[i]);
        unknown_index.push_back(i);
      }
      fps.assign(targets_.size(), 0);
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        if (known[i]) fps[i] = *known[i];
      }
      for (const auto& t : unknown) commit_reads_.whole_bytes += t.bytes;
      const auto computed = fingerprint_params_locked(unknown);
      for (std::size_t k = 0; k < unknown.size(); ++k) fps[unknown_index[k]] = computed[k];
    }
    printed_at = Clock::now();
    // Names of the layout by index, looked up once per expected fingerprint (a scan per name
    // would cost N^2 string compares for N parameters).
    std::unordered_map<std::string_view, std::size_t> index_of;
    if (!expected_.empty()) {
      index_of.reserve(layout.size());
      for (std::size_t i = 0; i < layout.size(); ++i) index_of.emplace(layout[i].name, i);
    }
    for (const auto& [name, expected] : expected_) {
      std::optional<std::size_t> index;
      if (auto it = index_of.find(name); it != index_of.end()) index = it->second;
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
    checked_at = Clock::now();
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
    metrics_.commit_fingerprint_read_bytes = commit_reads_.total();
    metrics_.update_seconds.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begun_at_).count());
    metrics_.update_bytes.observe(static_cast<double>(metrics_.bytes_applied - bytes_at_begin_));
  }
  finish_locked();
  const auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  logger("update")->info("update {} committed ({} buckets)", next.number, buckets_this_update_);
  logger("update")->debug(
      "update {}: commit over {} parameters: coverage {:.3f} ms, fingerprints {:.3f} ms (read "
      "{:.1f} MiB: {:.1f} in chunks where pieces meet, {:.1f} in pieces, {:.1f} in whole "
      "parameters), checks {:.3f} ms, publish {:.3f} ms (host mirror refresh: {})",
      next.number, targets_.size(), ms(commit_start, covered_at), ms(covered_at, printed_at),
      commit_reads_.total() / 1048576.0, commit_reads_.chunk_bytes / 1048576.0,
      commit_reads_.piece_bytes / 1048576.0, commit_reads_.whole_bytes / 1048576.0,
      ms(printed_at, checked_at), ms(checked_at, Clock::now()),
      options_.mirror_refresh == MirrorRefreshMode::commit ? "at commit" : "background");
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
                                         const std::vector<std::uint64_t>& fingerprints) noexcept {
  const bool background = options_.mirror_refresh != MirrorRefreshMode::commit;
  try {
    std::vector<std::size_t> params;
    params.reserve(targets_.size());
    for (const auto& t : targets_) params.push_back(t.store_index);
    // Clears the mirror's committed version first and records `version` only once every byte
    // landed; a copy that fails is logged by the store and leaves no committed version.
    store_.refresh_mirror(layout_tags_, {version.number, version.label}, params, fingerprints,
                          background);
  } catch (const std::exception& e) {
    // The live weights are complete and verified; only the rollback copy is missing.
    try {
      logger("update")->warn(
          "version {} published without a host mirror copy: its refresh could not start: {}",
          version.number, e.what());
    } catch (...) {
    }
  }
}

void UpdateEngine::publish_locked(const WeightVersion& version,
                                  std::vector<std::uint64_t> fingerprints, bool refresh_mirror) {
  const bool refresh = refresh_mirror && all_tags_backup_locked();
  std::vector<std::uint64_t> refresh_prints;
  if (refresh) refresh_prints = fingerprints;
  for (const auto& tag : layout_tags_) store_.set_contents_valid(tag, true, {});
  // By layout index: names copied only when the layout was bound anew (a map by name per commit
  // cost ~1 ms at 4096 parameters, comparing the names ~0.1 ms); fingerprints() makes the map
  // when asked.
  const auto& layout = plans_.layout();
  const std::size_t n = std::min(fingerprints.size(), layout.size());
  fingerprints.resize(n);
  const bool same_names = fingerprint_names_.size() == n && names_binding_ == bindings_;
  std::vector<std::string> names;
  if (!same_names) {
    names.reserve(n);
    for (std::size_t i = 0; i < n; ++i) names.push_back(layout[i].name);
  }
  {
    std::lock_guard state(state_mutex_);
    published_ = version;
    fence_.reset();
    if (!same_names) {
      fingerprint_names_ = std::move(names);
      names_binding_ = bindings_;
    }
    fingerprint_values_ = std::move(fingerprints);
  }
  // Published first: the mirror catches up after (in the background by default), holding no
  // committed version until it holds all of this one.
  if (refresh) refresh_mirror_locked(version, refresh_prints);
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
  // No scatter may still write while the weights are rolled back or fenced.
  if (cuda_) {
    if (const std::string error = cuda_->drain(); !error.empty()) {
      logger("update")->error("device work of the failed update also failed: {}", error);
    }
    cuda_->drop_queued_fingerprints();
  }
  read_checks_.clear();
  bool dirty = false;
  std::uint64_t version = 0;
  WeightVersion published;
  {
    std::lock_guard state(state_mutex_);
    dirty = dirty_;
    version = active_version_;
    published = published_;
  }
  try {
    const std::string reason = fmt::format("update {} aborted {}: {}", version, where, why);
    // No refresh starts during an update; one begin() pre-empted (or, with "complete", waited
    // for) ends within a batch. Waiting for it gives the outcome the fence reason names.
    store::MirrorRefreshState refresh;
    if (dirty) refresh = wait_for_mirror_locked();
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
      std::string mirror_note;
      if (refresh.failed && published.committed && refresh.version == published.number) {
        mirror_note = fmt::format(
            "; the host mirror did not hold the published version {}: its refresh failed: {}",
            published.number, refresh.error);
      }
      fence_locked(reason + mirror_note +
                   "; weights are partial until a full update or disk reload succeeds");
    }
  } catch (...) {
    fence_locked("an update was aborted and its cleanup failed; weights may be partial");
  }
  {
    // Counted once its outcome (rolled back or fenced) is in place and logged: a reader of the
    // metrics then sees the abort's health and reason too.
    std::lock_guard state(state_mutex_);
    metrics_.updates_aborted += 1;
  }
  finish_locked();
}

void UpdateEngine::verify_read_in_place_locked() {
  if (read_checks_.empty()) return;
  const auto actual = cuda_locked().take_queued_fingerprints();
  if (actual.size() != read_checks_.size()) {
    fail(FERRY_STATUS_INTERNAL, "{} batches of fingerprints for the {} buckets read in place",
         actual.size(), read_checks_.size());
  }
  for (std::size_t b = 0; b < read_checks_.size(); ++b) {
    const auto& check = read_checks_[b];
    if (actual[b].size() != check.expected.size()) {
      fail(FERRY_STATUS_INTERNAL, "{} fingerprints for the {} entries read in place",
           actual[b].size(), check.expected.size());
    }
    for (std::size_t k = 0; k < check.expected.size(); ++k) {
      if (actual[b][k] == check.expected[k]) continue;
      const auto m = manifest::decode(check.manifest_bytes);
      fail(FERRY_STATUS_CORRUPT_DATA,
           "bucket {}: tensor '{}': fingerprint of the read in place bytes {:016x} differs from "
           "the sender's {:016x}",
           m.bucket_index, m.tensors.at(check.entries[k]).name, actual[b][k], check.expected[k]);
    }
  }
  read_checks_.clear();
}

void UpdateEngine::finish_locked() noexcept {
  store_.end_writes(layout_tags_);
  std::lock_guard state(state_mutex_);
  active_ = false;
  dirty_ = false;
  direct_writes_ = false;
  writer_fingerprints_ = false;
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
  const auto refresh = wait_for_mirror_locked();
  bind_layout_locked();
  const auto mirror = store_.mirror();
  const auto committed = mirror ? mirror->committed() : std::nullopt;
  if (!committed) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "the host mirror holds no committed weights{}",
         refresh.failed ? fmt::format(" (its refresh with version {} failed: {})",
                                      refresh.version, refresh.error)
                        : std::string());
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
  // Keep the mirror's record (used after a restart) in step with the published label, once a
  // running refresh (which records the label it started with) has ended.
  (void)wait_for_mirror_locked();
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
  UpdateMetrics out;
  {
    std::lock_guard state(state_mutex_);
    out = metrics_;
    out.fenced = fence_.has_value();
  }
  try {
    const auto refresh = store_.mirror_refresh_state();  // the store's lock only, never a wait
    out.mirror_refresh_seconds = refresh.last_seconds;
    out.mirror_refresh_waits = refresh.waits;
    const bool whole = refresh.finished > 0 && !refresh.running && !refresh.failed;
    out.mirror_version = whole ? refresh.version : 0;
  } catch (const std::exception&) {
    // Metrics stay readable without the store's figures.
  }
  return out;
}

std::map<std::string, std::uint64_t> UpdateEngine::fingerprints() const {
  std::lock_guard state(state_mutex_);
  std::map<std::string, std::uint64_t> out;
  for (std::size_t i = 0; i < fingerprint_values_.size(); ++i) {
    out.emplace(fingerprint_names_[i], fingerprint_values_[i]);
  }
  return out;
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

std::vector<TensorReads> UpdateEngine::reads(std::span<const ferry_tensor_desc_t> tensors) {
  std::lock_guard lock(op_mutex_);
  return reads_of(plans_.plan(tensors), tensors);
}

}  // namespace ferry::update
