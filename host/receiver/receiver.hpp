// receiver/receiver.hpp: the receiver: one object that owns a model binding, a weight store and
// an update engine, and offers the operations of the control API (HTTP, C API, Python). The
// standalone `ferry serve` and an embedded receiver are both this class.
//
// Threading: every method may be called from any thread. Mutating operations (updates, release,
// resume, version changes) are serialized; health(), version() and metrics_text() never block
// behind a running update.
#pragma once

#include <ferry/plugin.h>

#include "order/stream_order.hpp"
#include "receiver/engine_control.hpp"
#include "update/bucket_source.hpp"
#include "update/update_engine.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ferry::config {
struct Config;
}
namespace ferry::registry {
class Registry;
}

namespace ferry::receiver {

struct VersionInfo {
  // The published update's number: a session's own (the sender's), else the previous one + 1.
  // Only increases (UpdateEngine::begin refuses one not above it); 0 before the first commit.
  std::uint64_t number = 0;
  std::string label;  // the weight_version string as the control API names it
};

struct Health {
  bool ready = false;
  // "ready", "loading", "updating", "released", "invalid" (resumed after a discard release,
  // until the next full update), "fenced", "empty"
  std::string state;
  std::string reason;  // why not ready ("" when ready)
};

struct UpdateReport {
  VersionInfo version;
  std::uint64_t bytes = 0;
  std::uint64_t tensors = 0;
  std::uint64_t buckets = 0;
  double seconds = 0;
};

struct WeightValues {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;  // this rank's shard of the checkpoint tensor
  std::vector<double> values;        // first truncate_size values of the flattened tensor
};

struct TagState {
  std::string tag;
  std::uint64_t bytes = 0;
  bool released = false;
  std::string policy;  // "discard" or "backup"
  bool contents_valid = true;
};

class Receiver {
 public:
  // Loads the model plugin named by the config (or detected later from the first checkpoint's
  // config.json) and the transports it needs from `registry`, which must outlive the receiver.
  Receiver(const config::Config& config, const registry::Registry& registry);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // update_weights_from_disk: reads a safetensors file or folder through the disk transport and
  // applies it as one update. The first load also creates the parameters (the target layout).
  // Failure leaves the previous version published (restored or fenced, see health()).
  UpdateReport update_from_disk(const std::filesystem::path& path,
                                const std::optional<std::string>& label);

  // The start of a standalone receiver (`ferry serve`), before any other update. With
  // memory.mirror_path naming a host mirror file that holds a committed version of this
  // receiver's layout, restores that version (verified against the fingerprints the mirror
  // recorded) and publishes it: the layout comes from the headers of `model_path` (its weights
  // are not read) or, when `model_path` is empty, from the catalog the mirror recorded. Otherwise
  // (no file, a torn or damaged one, no committed version, another layout, a failed restore) it
  // says why at warn and loads `model_path` as update 1 (an empty `model_path`: no weights until
  // the first update); the file is then replaced by a mirror of the new layout. FAILED_PRECONDITION
  // when the mirror file is in use by another running process; the errors of update_from_disk.
  // Returns the published version (number 0 when none).
  VersionInfo start(const std::filesystem::path& model_path);

  // Applies one update from buckets already in memory (bucket bytes + manifest bytes each).
  // `expected` maps parameter names to fingerprints the sender computed; a mismatch aborts the
  // update.
  struct Bucket {
    std::vector<std::byte> data;
    std::vector<std::uint8_t> manifest;
  };
  UpdateReport apply_update(const std::vector<Bucket>& buckets, std::uint64_t version_hint,
                            const std::optional<std::string>& label,
                            const std::map<std::string, std::uint64_t>& expected = {});

  // Embedded receiver: defines the layout from parameters the engine allocated itself. They are
  // engine-owned (written in place, never reallocated or freed; their tag cannot be released by
  // ferry). The model plugin named by receiver.model_family maps checkpoint names onto them
  // ("identity" when the sender's names are the parameter names). FAILED_PRECONDITION when a
  // layout exists already; INVALID_ARGUMENT naming a bad or duplicate parameter.
  struct EngineParam {
    std::string name;
    ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
    std::vector<std::uint64_t> shape;
    void* data = nullptr;
    ferry_memory_kind_t memory_kind = FERRY_MEMORY_HOST;
    int device = 0;
  };
  void register_params(const std::vector<EngineParam>& params);

  // How every update waits for the engine's work on engine-owned CUDA parameters before its
  // first write into them (docs/architecture.md, "Stream ordering"); the default synchronises their
  // devices. Events are refused (INVALID_ARGUMENT): an order is used by every update. Ferry-owned
  // weights (`ferry serve`) have no engine in this process and wait for nothing.
  void set_engine_order(order::StreamOrder order);

  // The CUDA device the weights are on (registered engine parameters or the CUDA store), or -1
  // for host weights. Before any layout: receiver.device's. Where device transports put staging.
  int weights_cuda_device() const;

  // ---- updates streamed by a source (sessions, NCCL groups, checkpoint-engine) -------------
  // The receiver's update lock, held from open_session() until this is destroyed, and the
  // layout a source's handshake needs. The update itself is run() of a bucket source through
  // the update loop (update/update_loop.hpp), which begins, applies, commits, or aborts (the
  // published version stays; the update engine restores or fences, see health()).
  // Threading: used by one thread at a time.
  class StreamingUpdate {
   public:
    ~StreamingUpdate();
    StreamingUpdate(const StreamingUpdate&) = delete;
    StreamingUpdate& operator=(const StreamingUpdate&) = delete;

    // FNV-1a 64 over this rank's layout (count, then per parameter name, dtype, dims) and its
    // parameter count: what the handshake reports.
    std::uint64_t layout_signature() const;
    std::size_t num_params() const;
    // Direct delivery (update::UpdateEngine::direct_destinations): where each of `tensors` may
    // be written in place by the peer.
    std::vector<std::optional<update::UpdateEngine::DirectDestination>> direct_destinations(
        std::span<const ferry_tensor_desc_t> tensors);
    // Direct delivery of blocks (update::UpdateEngine::block_destinations).
    std::vector<std::optional<update::UpdateEngine::DirectDestination>> block_destinations(
        std::span<const ferry_tensor_desc_t> catalog,
        std::span<const update::UpdateEngine::BlockRef> blocks);
    // What this rank's plan reads of each of `tensors` (update::UpdateEngine::reads).
    std::vector<update::TensorReads> reads(std::span<const ferry_tensor_desc_t> tensors);
    // Runs update `version` (the published number on commit; label default: the number) from
    // `source` through the update loop; `phase`: update::UpdateRun::phase. Once per object.
    UpdateReport run(update::BucketSource& source, std::uint64_t version,
                     const std::optional<std::string>& label, std::string* phase = nullptr);
    // Counts the releases and resumes of the receiver's memory (read under the update lock): a
    // session that shared memory with its sender may write it only while this is unchanged.
    std::uint64_t memory_epoch() const;

   private:
    friend class Receiver;
    struct Impl;
    explicit StreamingUpdate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
  };
  // The memory epoch (StreamingUpdate::memory_epoch) read without the update lock: a release or
  // resume may follow at once, so a caller compares it again under the lock before it writes.
  std::uint64_t memory_epoch() const;
  // The handshake of a session: takes the update lock (FAILED_PRECONDITION when another update
  // runs, or still runs after `wait`: a kept session's rejoin waits that long) and checks `catalog`
  // (the sender's checkpoint tensors: name, dtype, shape) against this receiver's layout, creating
  // the layout from it when there is none yet (`config_json`: the checkpoint's config.json text, or
  // empty). INCOMPATIBLE naming the first differing tensor. `catalog_key`:
  // manifest::catalog_key(catalog) when the caller keeps it (a kept session's later updates), else
  // computed here.
  std::unique_ptr<StreamingUpdate> open_session(std::span<const ferry_tensor_desc_t> catalog,
                                                const std::string& config_json,
                                                const std::string* catalog_key = nullptr,
                                                std::chrono::milliseconds wait = {});

  // get_weights_by_name: `name` is a checkpoint name, mapped through the layout; the first
  // `truncate_size` values; INVALID_ARGUMENT, before any value is read, when that would be more
  // than kMaxWeightValues (a larger truncate_size of a smaller tensor returns all of it).
  // Costs what it returns: only those values are read (65536 values: ~1.5 MB of JSON, ~30 ms).
  static constexpr std::size_t kMaxWeightValues = std::size_t{1} << 16;
  WeightValues weights_by_name(const std::string& name, std::size_t truncate_size) const;

  void set_version_label(const std::string& label);
  VersionInfo version() const;
  Health health() const;

  // Tags: empty means every tag. Errors: unknown tag, double release/resume.
  // release() first runs the release hook (below), under the update lock.
  void release(const std::vector<std::string>& tags);
  void resume(const std::vector<std::string>& tags);
  std::vector<TagState> memory_state() const;
  // Called by release() with the update lock held, before any memory goes, with a reason to
  // give: the session endpoint ends its kept sessions there, so that no sender still maps memory
  // being released (an importer's mapping keeps the physical memory alive). One hook per
  // receiver (its endpoint's); an empty function removes it, after a running hook returned.
  // Must not call into the receiver.
  void set_release_hook(std::function<void(const std::string& reason)> hook);
  // Called by resume() with the update lock held, once the weights are resident again (their
  // backup restored): the session endpoint tells suspended kept sessions, whose senders then
  // rejoin before their next push. Same rules as the release hook.
  void set_resume_hook(std::function<void()> hook);

  // Fingerprints (docs/fingerprint.md) of every parameter, by parameter name.
  std::map<std::string, std::uint64_t> fingerprints() const;

  // The engine around this receiver: its callbacks (pause, resume, flush caches, post-load
  // processing, engine memory tags) and the state of pause and the weight-update session that
  // the control API's SGLang routes drive. Valid as long as the receiver.
  EngineControl& engine_control() const;

  // Prometheus text exposition of counters and state.
  std::string metrics_text() const;

  // The target layout (parameter names, dtypes, shapes), empty before the first load.
  std::vector<ferry_tensor_desc_t> layout() const;

  // The checkpoint tensors this receiver expects (names, dtypes, shapes of the checkpoint the
  // layout was made from), for senders that name no tensors up front (checkpoint-engine). When
  // the layout came from registered engine parameters there is no checkpoint: the layout stands
  // in (the identity model family). Names stay valid until the layout changes.
  std::vector<ferry_tensor_desc_t> checkpoint_catalog() const;

  // The config and plugin registry this receiver was made with (for components beside it, such
  // as the NCCL weight-update groups in group/receiver_groups.hpp). Valid as long as the
  // receiver.
  const config::Config& receiver_config() const;
  const registry::Registry& plugin_registry() const;

  // Internal (receiver/receiver_state.hpp).
  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace ferry::receiver
