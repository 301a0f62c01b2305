// update/update_engine.hpp: applies one versioned update (a sequence of buckets) to the weight
// store as a transaction: bucket -> manifest (validated) -> fingerprints checked -> cached plan
// -> scatter; commit proves every parameter was fully written, checks fingerprints and only
// then publishes the version.
//
// Memory kinds. Each parameter is written where it lives: host parameters by the CPU kernels,
// CUDA parameters (ParamInfo.memory_kind FERRY_MEMORY_CUDA: the CUDA weight store or engine-owned
// device tensors) by the CUDA kernels on the engine's own streams (update/cuda_apply.hpp). A
// bucket may be in host memory (disk, sockets) or device memory (device transports): a host
// bucket bound for device parameters is copied to a device staging bucket, double-buffered so
// the copy of bucket k+1 overlaps the scatter of bucket k. The plan cache keeps, beside each
// plan, its split by memory kind and the device op table, so a repeated update uploads nothing
// per bucket. Device work is asynchronous; commit waits for it before checking coverage and
// fingerprints, and a failure drains it before rolling back.
//
// Transactions (docs/architecture.md, "Transactions"). The published version never advances on failure.
// The first bucket that writes into live weights makes the store dirty. When an update fails
// (any error in apply_bucket or commit) or is aborted while dirty:
//  - if the host mirror holds the weights of the published version (every layout tag has policy
//    Backup, the mirror's committed version is the published one and every layout parameter's
//    slot is filled: mirror_holds_published_locked, the one gate for a rollback), they are
//    copied back: the receiver stays healthy at the old version;
//  - otherwise the receiver is FENCED: health() is not ready, with a reason naming the update,
//    the bucket and the error (and, when the mirror lacks the published version because its
//    refresh failed, that version and the refresh's error), until a later update commits fully
//    (or restore_from_mirror succeeds). Never a rollback to a mix of versions.
//
// The host mirror's refresh (UpdateOptions::mirror_refresh, config memory.mirror_refresh). When
// every layout tag has policy Backup, commit and adopt_current publish the version first, then
// copy the weights into the mirror (WeightStore::refresh_mirror): by default in the background,
// so that commit returns once the copy is under way; with MirrorRefreshMode::commit before commit
// returns. From the start of that copy until its last byte landed the mirror holds NO committed
// version (the store clears it first and records the new one last), so nothing can restore a
// mix of versions from it. Whatever writes the weights or reads the mirror waits for a running
// refresh first:
//  - begin() waits before it returns, hence before the first write into live weights: before
//    apply_bucket, and before begin_direct_writes lets a session tell a direct-writing sender
//    Ready (the sender writes device memory only after that). No refresh can start during an
//    update: only commit and adopt_current start one, and adopt_current refuses an active update.
//  - the rollback (fail_locked: abort, any failure), restore_from_mirror, set_version_label and
//    the engine's destructor wait too; so do the store's release, resume, write, begin_writes,
//    save_to_mirror and restore_from_mirror, and its destructor joins the copy.
// So an update that fails after a background refresh rolls back to exactly the published
// version; if that refresh failed (the store logs it once at warn), the failed update fences,
// with a reason naming the version and the refresh's error.
//
// Threading: begin/apply_bucket/set_expected_fingerprints/commit/abort/restore_from_mirror are
// serialized by the engine (one update at a time; a call from another thread waits for the one
// in progress). version(), health(), metrics() and active() may be called from any thread at any
// time and never wait for a bucket to finish, nor for a mirror refresh. A background refresh runs
// on the store's worker thread, outside every engine lock.
#pragma once

#include "store/weight_store.hpp"
#include "update/block_plan.hpp"
#include "update/bucket_source.hpp"
#include "update/histogram.hpp"
#include "update/plan_cache.hpp"
#include "update/plan_provider.hpp"
#include "update/written_ranges.hpp"

#include <ferry/kernels/cpu.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>

namespace ferry::update {

class CudaApplier;

// When the host mirror copies a committed version (config memory.mirror_refresh).
enum class MirrorRefreshMode {
  background,  // commit publishes and returns; the copy runs on the store's worker thread; an
               // update that begins before it ended pre-empts it (no rollback copy then)
  complete,    // the same, but the next update waits for the copy to end (always a rollback copy)
  commit,      // commit returns after the copy ended (the pre-background behaviour)
};

struct UpdateOptions {
  bool verify_fingerprints = true;  // check entry fingerprints before writing a bucket
  // Direct delivery whose fingerprints the writing copy computed (begin_direct_writes(true)):
  // take them as the fingerprints of what was written instead of reading it back at commit
  // (config update.direct_verify = "writer").
  bool trust_writer_fingerprints = true;
  unsigned threads = 0;             // kernel threads; 0: the hardware count
  std::size_t plan_cache_capacity = 1024;
  std::size_t missing_names_listed = 8;  // how many missing parameters an error names
  MirrorRefreshMode mirror_refresh = MirrorRefreshMode::background;  // see Transactions
};

struct WeightVersion {
  bool committed = false;  // false until the first commit (or restore / adopt)
  std::uint64_t number = 0;
  std::string label;
};

struct Health {
  bool ready = false;
  std::string reason;  // why not ready; empty when ready
};

struct UpdateMetrics {
  std::uint64_t updates_committed = 0;
  std::uint64_t updates_aborted = 0;
  std::uint64_t buckets_applied = 0;
  std::uint64_t bytes_applied = 0;
  double seconds_applying = 0;  // time inside apply_bucket
  std::uint64_t plan_cache_hits = 0;
  std::uint64_t plan_cache_misses = 0;
  std::uint64_t rollbacks = 0;  // aborts repaired from the host mirror
  bool fenced = false;
  // The store's host mirror refresh (store::MirrorRefreshState): the last one's duration, from
  // its start to its last byte, and how many calls found one running and waited for it.
  double mirror_refresh_seconds = 0;
  std::uint64_t mirror_refresh_waits = 0;
  // The version the last refresh copied whole; 0 while one runs, after one failed or was
  // pre-empted, and before the first.
  std::uint64_t mirror_version = 0;
  // Bytes the last commit read to fingerprint parameters: what no copy hashed as it wrote it.
  std::uint64_t commit_fingerprint_read_bytes = 0;
  // Of every committed update: seconds from begin() to the version published, and bytes
  // applied (staged buckets and bytes written in place).
  Histogram update_seconds = update_seconds_histogram();
  Histogram update_bytes = update_bytes_histogram();
};

class UpdateEngine {
 public:
  // `store` and `plans` must outlive the engine. The layout's parameters must be in the store
  // (placed or registered) before begin().
  UpdateEngine(store::WeightStore& store, PlanProvider& plans, UpdateOptions options = {});
  ~UpdateEngine();
  UpdateEngine(const UpdateEngine&) = delete;
  UpdateEngine& operator=(const UpdateEngine&) = delete;

  // Starts update `version`. FAILED_PRECONDITION when an update is active, when a version is
  // published and `version` is not above it (versions only increase; the number of an update
  // that never committed may be used again), or when a layout tag is released; NOT_FOUND /
  // INCOMPATIBLE when a layout parameter is missing from the store or has another dtype or shape.
  // Clears the expected fingerprints. Waits for a running mirror refresh before it returns (see
  // Transactions): nothing may write the weights before.
  void begin(std::uint64_t version, std::string label);
  // The label the active update publishes with, for a source that learns it at the end.
  // FAILED_PRECONDITION without an active update.
  void set_label(std::string label);

  // Applies one bucket: decodes and validates `manifest_bytes` (its bucket_bytes must equal
  // bucket.size(); a non-zero manifest version must equal the active one), verifies every entry
  // fingerprint (CORRUPT_DATA naming the tensor) before any byte is written, gets the plan
  // (cached by signature) and scatters. Any error aborts the update (see Transactions) and is
  // rethrown. FAILED_PRECONDITION without an active update.
  // `bucket_kind` says where the bucket is: FERRY_MEMORY_HOST / FERRY_MEMORY_PINNED (host memory;
  // page-locked memory is copied to the device without a bounce) or FERRY_MEMORY_CUDA (device
  // memory of the parameters' device). Returns once the bucket's memory may be reused: a host
  // bucket after its bytes were copied off (device scatters may still run, until commit), a
  // device bucket after its scatter finished.
  void apply_bucket(std::span<const std::byte> bucket, std::span<const std::uint8_t> manifest_bytes,
                    ferry_memory_kind_t bucket_kind = FERRY_MEMORY_HOST);

  // The update loop's entry (update/update_loop.hpp): applies a staged bucket as apply_bucket
  // does, or records one written in place as record_direct_bucket does (bucket.in_place). Uses
  // bucket.manifest when the source decoded it (manifest::decode validated it), else decodes
  // bucket.manifest_bytes once and stores the result there. Where the source gave
  // bucket.entry_fingerprints (computed from these bytes), they are compared with the manifest's
  // instead of reading the bytes again.
  void apply(Bucket& bucket);

  // Host staging memory for buckets this engine applies: `slot` 0 or 1 (double buffering), at
  // least `bytes` bytes, aligned to FERRY_BUCKET_ALIGNMENT, page-locked when the layout has device
  // parameters (so reads into it feed the device at PCIe speed). Kept across updates; valid until
  // the next call for the same slot with more bytes, or the engine's destruction. Not for use
  // while an update applies from that slot.
  std::span<std::byte> host_staging(int slot, std::uint64_t bytes);

  // What this rank's plan reads of each of `tensors` (a sharded update's global catalog: what
  // this receiver needs of each, update::reads_of). Throws the plan's errors.
  std::vector<TensorReads> reads(std::span<const ferry_tensor_desc_t> tensors);

  // ---- direct delivery (docs/architecture.md, "Three ways to deliver"): a peer writes parameters
  // in place. Where a checkpoint tensor lands when its plan is one whole, contiguous copy (no cast,
  // no transform) into a parameter in device memory: the peer may write it there itself.
  struct DirectDestination {
    std::byte* data = nullptr;  // the first byte the tensor's bytes go to
    std::uint64_t bytes = 0;
    std::byte* block = nullptr;  // the memory block holding it (ParamInfo::block)
    std::uint64_t block_bytes = 0;
    std::uint64_t param_offset = 0;  // where `data` is in its parameter (bytes)
    std::uint64_t param_bytes = 0;   // the parameter's size
  };
  // One per tensor, in order; nullopt where the plan is not such a copy (or fails). Binds the
  // layout when no update is active.
  std::vector<std::optional<DirectDestination>> direct_destinations(
      std::span<const ferry_tensor_desc_t> tensors);
  // Direct delivery of blocks (a sharded update's pieces, each of the global tensor `tensor` of
  // `catalog`): where each block lands when the tensor's plan restricted to it
  // (update::restrict_to_block) is one contiguous copy into a device parameter, as
  // direct_destinations says of whole tensors (record_direct_bucket then takes the block's
  // entries); nullopt elsewhere. Binds the layout when no update is active.
  struct BlockRef {
    std::uint32_t tensor = 0;
    std::span<const std::uint64_t> offsets;
    std::span<const std::uint64_t> extents;
  };
  std::vector<std::optional<DirectDestination>> block_destinations(
      std::span<const ferry_tensor_desc_t> catalog, std::span<const BlockRef> blocks);
  // Declares that a peer writes the active update's parameters in place from now on: the store
  // is dirty at once (a failure rolls back or fences, see Transactions). Call it before the peer
  // may write. `writer_fingerprints`: the manifests' fingerprints are computed by the copy that
  // writes each tensor, from the words it stores (see UpdateOptions::trust_writer_fingerprints).
  void begin_direct_writes(bool writer_fingerprints = false);
  // Records one bucket a peer wrote in place (begin_direct_writes first): every manifest entry
  // must have a direct destination of its size; marks what it covers. Errors end the update.
  // The bytes are verified at commit, in one pass over everything written in place (a pass per
  // bucket would cost a fingerprint kernel's latency per bucket): each destination's
  // fingerprint (what was written) against its entry's (verify_fingerprints; CORRUPT_DATA
  // naming the tensor); those of whole parameters are then the parameters' fingerprints. With
  // writer fingerprints trusted, an entry's own fingerprint stands for what was written and
  // only entries without one are read back.
  void record_direct_bucket(std::span<const std::uint8_t> manifest_bytes);
  // Writer fingerprints that came after their buckets (the session's Commit): one per entry
  // recorded by record_direct_bucket, in recording order, for entries that had none. A count
  // that differs, or an entry given one twice, is CORRUPT_DATA and ends the update. With writer
  // fingerprints (begin_direct_writes(true)), commit fails for any entry still without one.
  // `chunk_hashes`, empty or one list per print: the writing copy's hash of each 1 MiB chunk of
  // an entry written at a chunk boundary of its parameter, numbered as the parameter's chunks
  // (empty lists for the others). With writer fingerprints trusted, a parameter written in
  // pieces then gets its fingerprint from its pieces' chunk hashes, reading only the chunks no
  // piece hashed whole, instead of all of it (docs/fingerprint.md).
  void attach_direct_fingerprints(std::span<const std::uint64_t> prints,
                                  std::span<const std::vector<std::uint64_t>> chunk_hashes = {});

  // Fingerprints (xxh64-interleaved-v1 of the parameter bytes) the sender computed, checked at
  // commit. A name that is not a layout parameter fails the commit. Needs an active update.
  void set_expected_fingerprints(std::map<std::string, std::uint64_t> expected);

  // Finishes the active update: every layout parameter must be fully written
  // (FAILED_PRECONDITION listing the first missing ones), fingerprints must match the expected
  // ones (CORRUPT_DATA naming the parameter). Then publishes the version and, when every layout
  // tag has policy Backup, refreshes the host mirror (in the background by default; see
  // Transactions). Any failure before the publication aborts the update; a mirror refresh that
  // fails leaves the version published, without a rollback copy.
  void commit();

  // Aborts the active update with `reason` (see Transactions). No-op without an active update.
  void abort(const std::string& reason);

  // Restart without the trainer: copies the host mirror's committed weights into the store,
  // verifies them against the fingerprints the mirror recorded and publishes the mirror's
  // version. FAILED_PRECONDITION when no update may start or the mirror holds no committed
  // version (a refresh still running is waited for first); CORRUPT_DATA naming the parameter on
  // a fingerprint mismatch (the store is fenced).
  void restore_from_mirror();

  // Declares the store's current contents (e.g. engine-owned weights the engine loaded itself)
  // as version `version`; refreshes the mirror when the layout tags have policy Backup.
  void adopt_current(std::uint64_t version, std::string label);

  // Changes only the label of the published version (/update_weight_version).
  void set_version_label(std::string label);

  WeightVersion version() const;
  Health health() const;
  UpdateMetrics metrics() const;
  bool active() const;
  // Fingerprints of the parameters computed at the last commit / restore / adopt.
  std::map<std::string, std::uint64_t> fingerprints() const;

 private:
  struct Target {
    std::size_t store_index = 0;
    kernels::ParamView view;
    std::uint64_t bytes = 0;
    std::string tag;
    bool device = false;  // CUDA memory: written and fingerprinted by the CUDA kernels
    std::byte* block = nullptr;  // ParamInfo::block / block_bytes (direct delivery)
    std::uint64_t block_bytes = 0;
  };

  void bind_layout_locked();
  std::vector<std::uint64_t> fingerprint_params_locked(const std::vector<Target>& targets);
  // Publishes a version and fingerprints; marks layout tags valid; then refreshes the mirror
  // (options_.mirror_refresh) when `refresh_mirror` and every layout tag has policy Backup.
  void publish_locked(const WeightVersion& version, std::vector<std::uint64_t> fingerprints,
                      bool refresh_mirror);
  bool all_tags_backup_locked() const;
  // Starts the store's refresh of the mirror with `version`; a refresh that cannot start is
  // logged (the version stays published without a rollback copy). Never throws.
  void refresh_mirror_locked(const WeightVersion& version,
                             const std::vector<std::uint64_t>& fingerprints) noexcept;
  // Waits for a running mirror refresh (store::WeightStore::wait_for_mirror_refresh).
  store::MirrorRefreshState wait_for_mirror_locked();
  // Ends the active update after a failure: rollback or fence. Never throws.
  void fail_locked(const std::string& where, const std::string& why) noexcept;
  void fence_locked(const std::string& reason) noexcept;
  bool mirror_holds_published_locked() const;
  void finish_locked() noexcept;
  void record_written(const ferry_plan_op_t& op);
  // The direct destination of `op` for an entry described by `desc`, if `op` is a whole,
  // contiguous copy into a device target.
  std::optional<DirectDestination> direct_destination_locked(const ferry_plan_op_t& op,
                                                             const ferry_tensor_desc_t& desc) const;
  // The CUDA path, created with the first layout that has device parameters.
  CudaApplier& cuda_locked();
  bool has_device_targets_locked() const;
  // Waits for device work of the update (no-op without device parameters); throws on its errors.
  void synchronize_device_locked();

  store::WeightStore& store_;
  PlanProvider& plans_;
  UpdateOptions options_;
  std::mutex op_mutex_;  // serializes update operations

  // Guarded by op_mutex_.
  PlanCache cache_;
  std::vector<Target> targets_;  // one per layout parameter
  std::vector<std::string> layout_tags_;
  std::vector<WrittenRanges> written_;
  // Tensors written in place this update (record_direct_bucket), verified at commit.
  // (No name: thousands per update, made and freed each time; messages name the parameter.)
  struct InPlaceWrite {
    const std::byte* data = nullptr;
    std::uint64_t bytes = 0;
    std::optional<std::uint64_t> expected;  // the sender's fingerprint
    std::uint32_t param = 0;
    bool whole = false;  // it covers the whole parameter
    std::uint64_t offset = 0;                // bytes into the parameter
    std::vector<std::uint64_t> chunk_hashes;  // attach_direct_fingerprints' (may be empty)
  };
  std::vector<InPlaceWrite> in_place_;
  // Buckets read in place from device memory this update: their fingerprints are queued on the
  // apply stream before their plans (CudaApplier::queue_fingerprints, one batch each, in this
  // order) and compared at commit, after the one wait for every bucket's kernels.
  struct ReadCheck {
    std::vector<std::uint8_t> manifest_bytes;  // decoded again only to name a mismatch
    std::vector<std::uint32_t> entries;        // the entries fingerprinted
    std::vector<std::uint64_t> expected;       // the sender's fingerprints of them
  };
  std::vector<ReadCheck> read_checks_;
  // Compares read_checks_ with the fingerprints the kernels computed (after a synchronize).
  void verify_read_in_place_locked();
  // What the running commit reads to fingerprint: chunks where pieces meet, pieces without a
  // trusted writer fingerprint, parameters fingerprinted whole (the debug log and the metric).
  struct CommitReads {
    std::uint64_t chunk_bytes = 0;
    std::uint64_t piece_bytes = 0;
    std::uint64_t whole_bytes = 0;
    std::uint64_t total() const { return chunk_bytes + piece_bytes + whole_bytes; }
  };
  CommitReads commit_reads_;
  // Verifies in_place_; returns per target the fingerprints of those written whole, and of those
  // written in pieces whose chunk hashes make it (assemble_from_chunks_locked).
  std::vector<std::optional<std::uint64_t>> verify_in_place_locked();
  void assemble_from_chunks_locked(std::vector<std::optional<std::uint64_t>>& known);
  // apply() for a staged bucket / one written in place (update_apply.cpp, update_direct.cpp).
  void apply_staged(Bucket& bucket);
  void record_direct(Bucket& bucket);
  // The bucket's manifest, decoded when the source did not, as a bucket of the active update
  // `version` (not a catalog; a non-zero version must be it); sets current_bucket_.
  const manifest::Manifest& bucket_manifest_locked(Bucket& bucket, std::uint64_t version);
  std::vector<std::optional<DirectDestination>> compute_direct_destinations_locked(
      std::span<const ferry_tensor_desc_t> tensors);
  std::map<std::string, std::uint64_t> expected_;
  std::uint64_t buckets_this_update_ = 0;
  std::optional<std::uint32_t> current_bucket_;
  std::shared_ptr<CudaApplier> cuda_;  // null until needed (and always without the cuda feature)
  std::vector<const std::byte*> bound_addresses_;  // of targets_, to invalidate device op tables
  std::optional<std::size_t> bound_param_count_;  // the store's, when targets_ were bound
  std::uint64_t bindings_ = 0;  // full binds so far (the layout walked); publish_locked's names
  std::uint64_t names_binding_ = 0;  // bindings_ when fingerprint_names_ were copied
  // The last direct_destinations answer, for the same catalog (manifest::catalog_key) while the
  // targets' memory stays where it was (each target's data and block pointers).
  std::string destinations_key_;
  std::vector<const std::byte*> destinations_where_;
  std::vector<std::optional<DirectDestination>> destinations_;
  std::array<std::shared_ptr<std::byte>, 2> staging_;
  std::array<std::uint64_t, 2> staging_bytes_{};
  std::array<bool, 2> staging_pinned_{};

  // Guarded by state_mutex_ (read from any thread).
  mutable std::mutex state_mutex_;
  bool active_ = false;
  bool dirty_ = false;
  bool direct_writes_ = false;  // begin_direct_writes() was called for the active update
  bool writer_fingerprints_ = false;  // ... with fingerprints computed by the writing copy
  std::uint64_t active_version_ = 0;
  std::string active_label_;
  WeightVersion published_;
  std::optional<std::string> fence_;
  // The published fingerprints by layout index (fingerprints() pairs them with the names).
  std::vector<std::string> fingerprint_names_;
  std::vector<std::uint64_t> fingerprint_values_;
  std::vector<std::string> health_tags_;  // copy of layout_tags_ for health()
  UpdateMetrics metrics_;
  // The active update's start and metrics_.bytes_applied then (its histogram entries).
  std::chrono::steady_clock::time_point begun_at_{};
  std::uint64_t bytes_at_begin_ = 0;
};

}  // namespace ferry::update
