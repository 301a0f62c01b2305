// store/weight_store.hpp: the weight store interface: parameters placed in tagged regions with
// stable virtual addresses, released and resumed by tag, backed up into the host mirror.
//
// Contract (docs/architecture.md, "The weight store"):
//  - A region is a range of memory with an address that never changes for the store's lifetime.
//    Each region belongs to a tag ("weights", "staging", "kv_cache", any string); a tag has a
//    policy and may hold several regions. Release drops the memory behind every region of the
//    tag but keeps the addresses reserved; resume maps memory back at the same addresses.
//  - Policy::Discard: after release the contents are undefined; contents_valid(tag) is false
//    (with a reason) until someone who rewrote every byte calls set_contents_valid(tag, true).
//    Policy::Backup: release first copies the tag's parameters into the host mirror and resume
//    copies them back, so the contents are exactly what they were.
//  - Backup tags are also copied into the mirror at each commit (refresh_mirror), in the
//    background by default: from the start of that copy until its last byte landed the mirror
//    holds NO committed version, and every call that writes parameters or uses the mirror waits
//    for the copy first (see refresh_mirror), so a mirror never records a version whose bytes
//    it does not hold in full.
//  - A parameter is ferry-owned (place(): carved out of a region of its tag, 256-byte aligned) or
//    engine-owned (register_external(): memory the engine allocated; the store never reallocates
//    or frees it). Releasing a tag that holds engine-owned parameters is the engine telling the
//    store that it is about to free or unmap that memory itself (a torch_memory_saver-style
//    allocator), and resuming it that the memory is mapped again at the same addresses: the
//    store saves (policy backup) and restores those parameters like its own, frees nothing of
//    theirs, and marks the tag released in between.
//  - Wrong-state calls (release twice, resume what is not released, an unknown tag, reads and
//    writes through the store API into a released tag) throw ferry::Error FAILED_PRECONDITION or
//    NOT_FOUND. Raw data pointers of a released ferry-owned region fault on access (PROT_NONE on
//    CPU) instead of silently reading zeros.
//
// Threading: every member function may be called from any thread; the store serializes them.
// A background refresh of the mirror copies on the store's own worker thread, without the
// store's lock; the calls that must not overlap it wait for it (refresh_mirror), the others
// (lookups, read, released, memory_state, ...) never do.
// Pointers returned in ParamInfo stay valid for the store's lifetime; the bytes behind them may be
// read and written without the store's lock only while the tag is not released, which is what
// begin_writes() guarantees for an update.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::store {

class HostMirror;
struct MirrorParam;
struct CommittedVersion;

enum class Policy {
  Discard,  // release drops the contents
  Backup,   // release saves the contents to the host mirror; resume restores them
};

// "discard" / "backup".
const char* policy_name(Policy policy) noexcept;
// Parses "discard" / "backup"; throws ferry::Error INVALID_ARGUMENT naming the value otherwise.
Policy policy_from_name(std::string_view name);

// Alignment of every placed parameter, in bytes.
inline constexpr std::uint64_t kParamAlignment = 256;

// A parameter to place: name, element type and shape.
struct TensorSpec {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

// What the store knows about one parameter.
struct ParamInfo {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::byte* data = nullptr;  // stable for the store's lifetime
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  std::string tag;
  bool external = false;  // engine-owned (register_external)
  ferry_memory_kind_t memory_kind = FERRY_MEMORY_HOST;
  // The memory block the parameter lies in, mapped whole while its tag is resident: its region
  // (ferry-owned) or the parameter itself (engine-owned). A transport shares blocks, not
  // parameters, so that one registration covers many parameters.
  std::byte* block = nullptr;
  std::uint64_t block_bytes = 0;
};

// The memory state of one tag, for /metrics and /health.
struct TagState {
  std::string tag;
  std::uint64_t bytes = 0;           // capacity of the tag's ferry-owned regions
  std::uint64_t external_bytes = 0;  // bytes of engine-owned parameters in the tag
  std::size_t params = 0;
  bool released = false;
  Policy policy = Policy::Discard;
  bool contents_valid = true;
  std::string reason;  // why contents are not valid; empty when they are
};

// The host mirror's refresh (WeightStore::refresh_mirror): whether one runs, how the last one
// ended and what it cost.
struct MirrorRefreshState {
  bool running = false;       // a refresh copies now; the mirror holds no committed version
  std::uint64_t version = 0;  // the version the running (or last) refresh copies (copied)
  bool failed = false;        // the last refresh failed: the mirror holds no committed version
  std::string error;          // why it failed; empty otherwise
  std::uint64_t finished = 0;  // refreshes that ended, succeeded or failed
  double last_seconds = 0;     // the last one that ended, from its start to its last byte
  std::uint64_t waits = 0;     // calls that found a refresh running and waited for it
};

// Bytes a region needs to hold `specs` placed in order (each aligned to kParamAlignment).
// Throws ferry::Error INVALID_ARGUMENT on an invalid dtype/shape or overflow.
std::uint64_t region_bytes_for(std::span<const TensorSpec> specs);

class WeightStore {
 public:
  virtual ~WeightStore() = default;

  // ---- layout --------------------------------------------------------------------------
  // Creates (or re-declares) `tag` with `policy`. Changing the policy of a released tag is
  // refused. A tag is also created, with Policy::Discard, by its first create_region or
  // register_external.
  virtual void set_policy(const std::string& tag, Policy policy) = 0;
  // Reserves a new region of at least `bytes` (rounded up to the page size) for `tag` and sets
  // the tag's policy. Throws OUT_OF_MEMORY when the address space cannot be reserved, and
  // FAILED_PRECONDITION when the tag is released.
  virtual void create_region(const std::string& tag, std::uint64_t bytes, Policy policy) = 0;
  // Places a parameter in the first region of `tag` with room; returns its index. Throws
  // INVALID_ARGUMENT (bad name, dtype or shape; duplicate name), NOT_FOUND (tag without
  // regions), OUT_OF_MEMORY (no region has room) or FAILED_PRECONDITION (tag released).
  virtual std::size_t place(const std::string& tag, const std::string& name, ferry_dtype_t dtype,
                            std::span<const std::uint64_t> shape) = 0;
  // Registers engine-owned memory holding one parameter; returns its index. `data` must stay
  // valid for the store's lifetime. The store never reallocates or frees it.
  virtual std::size_t register_external(const std::string& tag, const std::string& name,
                                        ferry_dtype_t dtype, std::span<const std::uint64_t> shape,
                                        void* data, ferry_memory_kind_t kind) = 0;
  // create_region(tag, region_bytes_for(specs), policy), then place every spec in order.
  // Returns the index of the first placed parameter.
  std::size_t place_all(const std::string& tag, Policy policy, std::span<const TensorSpec> specs);

  // ---- lookup --------------------------------------------------------------------------
  virtual std::size_t param_count() const = 0;
  // Throws NOT_FOUND for an index out of range.
  virtual ParamInfo param(std::size_t index) const = 0;
  virtual std::optional<std::size_t> find(std::string_view name) const = 0;
  // Throws NOT_FOUND naming the parameter.
  ParamInfo param(std::string_view name) const;
  // Every tag, sorted by name.
  virtual std::vector<std::string> tags() const = 0;
  // Parameter indices of `tag` in placement order; NOT_FOUND for an unknown tag.
  virtual std::vector<std::size_t> params_in(const std::string& tag) const = 0;
  // The memory kind of ferry-owned regions (FERRY_MEMORY_HOST for the CPU store).
  virtual ferry_memory_kind_t region_memory_kind() const noexcept = 0;

  // ---- checked access (the store API; raw pointers skip these checks) -------------------
  // Copies bytes into / out of a parameter at a byte offset. FAILED_PRECONDITION when the
  // parameter's tag is released, INVALID_ARGUMENT when the range is out of bounds.
  virtual void write(std::size_t index, std::uint64_t offset, std::span<const std::byte> bytes) = 0;
  virtual void read(std::size_t index, std::uint64_t offset, std::span<std::byte> out) const = 0;

  // ---- release / resume ----------------------------------------------------------------
  // Validates every tag first (known, not released, no update writing into it), then releases
  // them. Backup tags are saved to the host mirror first (engine-owned parameters too).
  virtual void release(std::span<const std::string> tags) = 0;
  // Validates every tag first (known, released), then maps memory back at the same addresses.
  // Backup tags get their contents back from the mirror; discard tags read as zeros on the CPU
  // store and hold undefined bytes on the CUDA store (contents_valid is false either way).
  virtual void resume(std::span<const std::string> tags) = 0;
  virtual bool released(const std::string& tag) const = 0;
  virtual bool contents_valid(const std::string& tag) const = 0;
  // Empty when contents are valid.
  virtual std::string invalid_reason(const std::string& tag) const = 0;
  // Called by whoever rewrote (valid = true) or corrupted (valid = false, with the reason) the
  // whole contents of a tag: the update engine after a full commit or a fenced abort.
  virtual void set_contents_valid(const std::string& tag, bool valid, std::string reason) = 0;
  virtual std::vector<TagState> memory_state() const = 0;

  // ---- writers ---------------------------------------------------------------------------
  // Marks `tags` as being written through raw pointers by `writer` (e.g. "update 7"): release
  // of those tags is refused until end_writes(). Refused when a tag is released or already has
  // a writer.
  virtual void begin_writes(std::span<const std::string> tags, const std::string& writer) = 0;
  virtual void end_writes(std::span<const std::string> tags) noexcept = 0;

  // ---- host mirror ---------------------------------------------------------------------
  // The mirror covers exactly the parameters of Backup tags, in placement order.
  virtual std::vector<MirrorParam> mirror_layout() const = 0;
  // The current mirror, or null when none exists yet (one is created on first need).
  virtual std::shared_ptr<HostMirror> mirror() const = 0;
  // Uses `mirror` (e.g. a file-backed one) from now on. Its layout must equal mirror_layout()
  // (INCOMPATIBLE otherwise, naming the first difference).
  virtual void attach_mirror(std::shared_ptr<HostMirror> mirror) = 0;
  // Copies the parameters of Backup tags `tags` into the mirror (creating an anonymous mirror
  // when none exists). FAILED_PRECONDITION for a released or non-Backup tag.
  virtual void save_to_mirror(std::span<const std::string> tags) = 0;
  // Copies them back from the mirror. FAILED_PRECONDITION for a released or non-Backup tag, or
  // when the mirror holds no copy of one of the parameters.
  virtual void restore_from_mirror(std::span<const std::string> tags) = 0;

  // ---- mirror refresh (a committed version into the mirror) ------------------------------
  // Copies the parameters of Backup tags `tags` into the mirror and records them as committed
  // version `version` (creating an anonymous mirror when none exists). First waits for a
  // running refresh; then, before the copy starts, clears the mirror's committed version and
  // the filled flags of the tags' entries, so that from here until the last byte landed the
  // mirror holds NO committed version. Only once every byte landed are the entries marked
  // filled and set_committed(version, ...) recorded, with `fingerprints[i]` for parameter
  // `params[i]` (store indices; 0 for the mirror's other entries).
  // `background`: the copy runs on the store's worker thread and the call returns while it runs;
  // otherwise it runs on the calling thread (the store's lock is not held during the copy either
  // way, so lookups and health checks do not stall behind it).
  // A copy that fails (a CUDA error, say) is not thrown: the mirror is left without a committed
  // version, the failure is logged once (warn, naming the version and the error) and reported by
  // mirror_refresh_state(). Throws only when the refresh cannot start: FAILED_PRECONDITION for a
  // released or non-Backup tag, INVALID_ARGUMENT for `params` and `fingerprints` of different
  // lengths or an unknown index; that is recorded as a failed refresh too.
  // Until the refresh ended, these wait for it: write, release, resume, begin_writes,
  // save_to_mirror, restore_from_mirror, attach_mirror, refresh_mirror and the layout changes
  // (set_policy, create_region, place, register_external); the store's destructor joins it.
  // The others do not wait, mirror() included: a caller that reads or changes the mirror
  // through that pointer calls wait_for_mirror_refresh() first.
  virtual void refresh_mirror(std::span<const std::string> tags, const CommittedVersion& version,
                              std::span<const std::size_t> params,
                              std::span<const std::uint64_t> fingerprints, bool background) = 0;
  // Pre-empts a running background refresh (config memory.mirror_refresh = "background": an
  // update that begins before the mirror caught up): no further copy starts and the refresh ends
  // as failed with `reason` (the mirror holds no committed version until the next refresh).
  // The one batch of kRefreshBatchBytes in flight still reads the weights: in host memory
  // begin_writes and write wait for it; in GPU memory they do not (a DMA read into mirror slots
  // nobody claims). Everything that reads or writes the mirror waits for the worker to end.
  // Returns at once; a no-op when no refresh runs.
  virtual void preempt_mirror_refresh(const std::string& reason) = 0;
  // Waits until no refresh runs; returns the state then.
  virtual MirrorRefreshState wait_for_mirror_refresh() = 0;
  // The state now, without waiting.
  virtual MirrorRefreshState mirror_refresh_state() const = 0;
};

}  // namespace ferry::store
