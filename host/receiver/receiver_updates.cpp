// receiver/receiver_updates.cpp: every update of a receiver as a bucket source run through the
// one update loop (update/update_loop.hpp): update_weights_from_disk (the source plugin reading
// into the engine's two staging buckets), buckets already in memory (apply_update), and the
// StreamingUpdate that sessions, NCCL groups and checkpoint-engine run their sources through.
#include "receiver/receiver_state.hpp"

#include <fmt/format.h>
#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/log.hpp"
#include "common/progress.hpp"
#include "receiver/client_input.hpp"
#include "receiver/source_reader.hpp"
#include "update/update_loop.hpp"

namespace ferry::receiver {

namespace fs = std::filesystem;

namespace {

// A long load from disk shows its progress as info lines of the log (config `progress`; never
// drawn in place, this is a log): none for "never", nor for "terminal" off a terminal.
ProgressMeter::Options load_progress(const config::Config& c) {
  ProgressMeter::Options o;
  o.style = progress_style(c.progress, stderr_is_terminal()) == ProgressStyle::none
                ? ProgressStyle::none
                : ProgressStyle::lines;
  o.interval = std::chrono::milliseconds(c.progress_interval_ms);
  return o;
}

// The buckets of a checkpoint as the source plugin reads them, into the engine's two host
// staging buckets (bucket k+1 is read while bucket k is applied); the progress of the load.
class DiskSource final : public update::BucketSource {
 public:
  DiskSource(SourceReader& reader, std::span<std::byte> slot0, std::span<std::byte> slot1,
             unsigned read_threads, ProgressMeter& progress)
      : reader_(reader), staging_{slot0, slot1}, threads_(read_threads), progress_(progress) {}

  bool double_buffered() const override { return true; }

  bool next(std::uint32_t slot, update::Bucket& out) override {
    std::uint64_t bytes = 0;
    if (!reader_.read(staging_[slot], threads_, out.manifest_bytes, bytes)) return false;
    out.slot = slot;
    out.kind = FERRY_MEMORY_HOST;
    return true;
  }

  void verify(update::Bucket& bucket) override {
    // The bucket is as long as its manifest says (decoded here, once).
    bucket.manifest = manifest::decode(bucket.manifest_bytes);
    const auto& staging = staging_[bucket.slot];
    if (bucket.manifest->bucket_bytes > staging.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "the manifest describes {} bucket bytes, more than the {} read",
           bucket.manifest->bucket_bytes, staging.size());
    }
    bucket.data = staging.first(static_cast<std::size_t>(bucket.manifest->bucket_bytes));
  }

  void applied(const update::Bucket& bucket) override {
    bytes_ += bucket.data.size();
    progress_.update(0, bytes_);
  }

 private:
  SourceReader& reader_;
  std::span<std::byte> staging_[2];
  unsigned threads_ = 0;
  ProgressMeter& progress_;
  std::uint64_t bytes_ = 0;
};

// Buckets already in memory, one after the other.
class MemorySource final : public update::BucketSource {
 public:
  MemorySource(const std::vector<Receiver::Bucket>& buckets,
               const std::map<std::string, std::uint64_t>& expected)
      : buckets_(buckets), expected_(expected) {}

  bool next(std::uint32_t, update::Bucket& out) override {
    if (next_ == buckets_.size()) return false;
    const auto& b = buckets_[next_++];
    out.data = b.data;
    out.manifest_bytes = b.manifest;
    return true;
  }

  update::UpdateEnd end() override { return {expected_, std::nullopt}; }

 private:
  const std::vector<Receiver::Bucket>& buckets_;
  const std::map<std::string, std::uint64_t>& expected_;
  std::size_t next_ = 0;
};

// One update of the receiver from `source` through the update loop. Caller holds update_mutex
// and marks the receiver busy.
UpdateReport run_locked(Receiver::State& s, update::BucketSource& source, std::uint64_t version,
                        std::string label, std::chrono::steady_clock::time_point started,
                        std::string* phase = nullptr) {
  s.wait_for_engine(version);
  const auto r = update::run_update(*s.engine, source, {version, std::move(label), started, phase});
  UpdateReport report;
  report.version = VersionInfo{r.version.number, r.version.label};
  report.bytes = r.bytes;
  report.tensors = r.tensors;
  report.buckets = r.buckets;
  report.seconds = r.seconds;
  return report;
}

}  // namespace

UpdateReport Receiver::update_from_disk(const fs::path& path,
                                        const std::optional<std::string>& label) {
  auto& s = *state_;
  const auto start = std::chrono::steady_clock::now();
  // Open and validate the whole checkpoint before touching anything, and before taking the
  // update lock: what a client names may be slow or malformed, and a refusal must not make other
  // updates wait (a FIFO or device is refused without opening it).
  check_checkpoint_path(path, "model_path");
  const std::string& source_name = s.config.receiver.transport;
  auto plugin = s.registry.transport(source_name);
  std::map<std::string, std::string> topts = s.config.transports[source_name];
  // update.read_threads reaches a source that declares a `read_threads` option of its own.
  const auto& declared = plugin->info().option_keys;
  const bool takes_threads =
      declared && std::find(declared->begin(), declared->end(), "read_threads") != declared->end();
  if (s.config.update.read_threads != 0 && takes_threads && !topts.count("read_threads")) {
    topts["read_threads"] = std::to_string(s.config.update.read_threads);
  }
  SourceReader reader(plugin, topts, path.string());
  const auto& cat = reader.catalog();
  // config.json matters to the first load only (the layout never changes afterwards).
  const std::string config_json =
      s.has_layout.load(std::memory_order_acquire) ? std::string() : read_config_json(path);

  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  }
  s.require_weights_resident();
  BusyGuard busy(s.busy, s.activity, s.engine ? "updating" : "loading");
  if (!s.engine) {
    s.create_layout(cat, config_json, path);
  } else {
    s.check_catalog(cat);
  }

  std::uint64_t largest = 0, total = 0;
  for (const auto& e : cat.tensors) {
    largest = std::max(largest, e.size);
    total += e.size;
  }
  std::uint64_t capacity = std::max<std::uint64_t>(
      std::min<std::uint64_t>(s.config.update.bucket_bytes, total + FERRY_BUCKET_ALIGNMENT),
      largest + FERRY_BUCKET_ALIGNMENT);
  capacity = sdk::bucket_align_up(capacity);
  // Two staging buckets: bucket k+1 is read while bucket k is applied. The engine keeps them
  // across updates, page-locked on a CUDA receiver (reads feed the device's H2D copies directly).
  const std::span<std::byte> staging[2] = {s.engine->host_staging(0, capacity),
                                           s.engine->host_staging(1, capacity)};
  const auto previous = s.engine->version();
  const std::uint64_t number = previous.number + 1;
  ProgressMeter progress(load_progress(s.config), [](const std::string& line, ProgressStyle, bool) {
    logger("receiver")->info("{}", line);
  });
  DiskSource source(reader, staging[0], staging[1], s.config.update.read_threads, progress);
  progress.begin(fmt::format("update {} from disk", number), total);
  const UpdateReport report =
      run_locked(s, source, number, label.value_or(std::to_string(number)), start);
  logger("receiver")
      ->info("update {} ('{}') from disk: {} tensors, {:.1f} MiB in {:.3f} s",
             report.version.number, report.version.label, report.tensors, report.bytes / 1048576.0,
             report.seconds);
  return report;
}

UpdateReport Receiver::apply_update(const std::vector<Bucket>& buckets, std::uint64_t version_hint,
                                    const std::optional<std::string>& label,
                                    const std::map<std::string, std::uint64_t>& expected) {
  auto& s = *state_;
  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  if (!lock.owns_lock()) fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  if (!s.engine) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "no layout yet: load a checkpoint from disk first (the first load defines the layout)");
  }
  s.require_weights_resident();
  const auto start = std::chrono::steady_clock::now();
  BusyGuard busy(s.busy, s.activity, "updating");
  const std::uint64_t number = version_hint != 0 ? version_hint : s.engine->version().number + 1;
  MemorySource source(buckets, expected);
  return run_locked(s, source, number, label.value_or(std::to_string(number)), start);
}

// ---- session updates ----------------------------------------------------------------------

struct Receiver::StreamingUpdate::Impl {
  State& s;
  std::unique_lock<std::mutex> lock;
  bool ran = false;

  Impl(State& state, std::unique_lock<std::mutex> held) : s(state), lock(std::move(held)) {}
};

Receiver::StreamingUpdate::StreamingUpdate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Receiver::StreamingUpdate::~StreamingUpdate() = default;

std::uint64_t Receiver::StreamingUpdate::layout_signature() const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  const auto& layout = impl_->s.binding->layout();
  mix(layout.size());
  for (const auto& p : layout) {
    mix(p.name.size());
    for (unsigned char c : p.name) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
    mix(static_cast<std::uint64_t>(p.dtype));
    mix(p.shape.size());
    for (auto d : p.shape) mix(d);
  }
  return h;
}

std::size_t Receiver::StreamingUpdate::num_params() const {
  return impl_->s.binding->layout().size();
}

std::vector<std::optional<update::UpdateEngine::DirectDestination>>
Receiver::StreamingUpdate::direct_destinations(std::span<const ferry_tensor_desc_t> tensors) {
  return impl_->s.engine->direct_destinations(tensors);
}

std::vector<std::optional<update::UpdateEngine::DirectDestination>>
Receiver::StreamingUpdate::block_destinations(
    std::span<const ferry_tensor_desc_t> catalog,
    std::span<const update::UpdateEngine::BlockRef> blocks) {
  return impl_->s.engine->block_destinations(catalog, blocks);
}

std::vector<update::TensorReads> Receiver::StreamingUpdate::reads(
    std::span<const ferry_tensor_desc_t> tensors) {
  return impl_->s.engine->reads(tensors);
}

std::uint64_t Receiver::StreamingUpdate::memory_epoch() const {
  return impl_->s.memory_epoch;
}

UpdateReport Receiver::StreamingUpdate::run(update::BucketSource& source, std::uint64_t version,
                                            const std::optional<std::string>& label,
                                            std::string* phase) {
  auto& i = *impl_;
  if (i.ran) fail(FERRY_STATUS_FAILED_PRECONDITION, "the session's update has begun already");
  i.ran = true;
  i.s.require_weights_resident();
  BusyGuard busy(i.s.busy, i.s.activity, "updating");
  return run_locked(i.s, source, version, label.value_or(std::to_string(version)),
                    std::chrono::steady_clock::now(), phase);
}

std::unique_ptr<Receiver::StreamingUpdate> Receiver::open_session(
    std::span<const ferry_tensor_desc_t> catalog, const std::string& config_json,
    const std::string* catalog_key, std::chrono::milliseconds wait) {
  auto& s = *state_;
  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  // Polled rather than a timed lock: ThreadSanitizer does not see pthread_mutex_clocklock.
  const auto until = std::chrono::steady_clock::now() + wait;
  while (!lock.owns_lock() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)lock.try_lock();
  }
  if (!lock.owns_lock()) fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  if (catalog.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "the sender's catalog is empty");
  // The same tensor list as the last session's (the usual case: every push of a training run)
  // was checked then; only a different one is built, validated and checked (~1 us per tensor).
  std::string key = catalog_key != nullptr ? *catalog_key : manifest::catalog_key(catalog);
  if (s.engine && !s.accepted_catalog.empty() && key == s.accepted_catalog) {
    s.require_weights_resident();
    return std::unique_ptr<StreamingUpdate>(
        new StreamingUpdate(std::make_unique<StreamingUpdate::Impl>(s, std::move(lock))));
  }
  manifest::Manifest cat;
  cat.tensors.reserve(catalog.size());
  for (const auto& d : catalog) {
    manifest::Entry e;
    e.name = d.name != nullptr ? d.name : "";
    e.dtype = d.dtype;
    if (d.ndim > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "catalog tensor '{}' has {} dims (at most {})", e.name,
           d.ndim, FERRY_MAX_DIMS);
    }
    e.shape.assign(d.shape, d.shape + d.ndim);
    e.size = byte_size(d.dtype, e.shape).value_or(0);
    cat.tensors.push_back(std::move(e));
  }
  manifest::validate(cat);
  if (!s.engine) {
    BusyGuard busy(s.busy, s.activity, "loading");
    s.create_layout(cat, config_json, fs::path("the session's catalog"));
  } else {
    s.check_catalog(cat);
  }
  s.accepted_catalog = std::move(key);
  s.require_weights_resident();
  return std::unique_ptr<StreamingUpdate>(
      new StreamingUpdate(std::make_unique<StreamingUpdate::Impl>(s, std::move(lock))));
}

}  // namespace ferry::receiver
