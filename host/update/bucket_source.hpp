// update/bucket_source.hpp: where the buckets of one update come from, as the update loop
// (update/update_loop.hpp) sees them: a BucketSource yields Buckets (bytes or a device pointer,
// the manifest, what the source verified) until its end, and is told when one was applied and when
// the update failed. Every update path is one: the disk reader, buckets already in memory, the
// session, an NCCL weight-update group and checkpoint-engine's parameter server.
//
// Threading: the loop calls next() and begun() on its own thread; verify(), applied() and
// apply_failed() on the thread that applies the bucket, which is another thread while next()
// runs when the source is double_buffered(). Calls for one bucket never overlap each other.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ferry::update {

// One bucket of an update.
struct Bucket {
  // The bucket's bytes, in memory of `kind` (FERRY_MEMORY_HOST / FERRY_MEMORY_PINNED: host memory;
  // FERRY_MEMORY_CUDA: device memory of the parameters' device). Owned by the source; valid until
  // applied() returned for this bucket. Empty for a bucket written in place.
  std::span<const std::byte> data;
  ferry_memory_kind_t kind = FERRY_MEMORY_HOST;
  // The manifest: decoded (and validated) once, by the source or, when it gives only the
  // encoded bytes, by the update engine (which then stores it here).
  std::vector<std::uint8_t> manifest_bytes;
  std::optional<manifest::Manifest> manifest;
  // How the source verified the bytes: the fingerprints (xxh64-interleaved-v1) of the entries as
  // they are in `data`, one per manifest entry, computed by the source from those bytes (for its
  // peer's acknowledgement). The engine compares the manifest's fingerprints with them instead
  // of reading the bytes a second time. Empty: the engine computes those it checks.
  std::vector<std::uint64_t> entry_fingerprints;
  // Written in place by the peer (direct delivery): no bytes to apply; the engine records what
  // the manifest covers and verifies it at commit.
  bool in_place = false;
  // Read in place (a session reading the sender's lent tensors): where each manifest entry's
  // bytes are, one address per entry in manifest order (memory of `kind`, valid until applied()
  // returned), instead of `data` plus the entry's offset; `data` is then empty. The engine
  // verifies and applies the entries from there.
  std::vector<const std::byte*> entry_data;
  // Source-defined, for device memory read in place: the entries stay readable (and their bytes
  // final) until the update commits or aborts, not only until applied() (a session's sender
  // lends its tensors until the Commit). The engine then queues the bucket's kernels and checks
  // without waiting for them; the commit waits once for all.
  bool readable_until_commit = false;
  // Source-defined: which staging slot holds the bytes, and the bucket's index.
  std::uint32_t slot = 0;
  std::uint32_t index = 0;
  // Source-defined: which of the source's peers sent it (a sharded update: the sender's rank).
  std::uint32_t origin = 0;
};

// The bytes a bucket brought: its data, or the manifest entries' bytes of a bucket read in place.
inline std::uint64_t bucket_payload_bytes(const Bucket& b) {
  if (b.entry_data.empty() || !b.manifest) return b.data.size();
  std::uint64_t bytes = 0;
  for (const auto& e : b.manifest->tensors) bytes += e.size;
  return bytes;
}

// What the sender said about the whole update, known once the last bucket arrived.
struct UpdateEnd {
  // Fingerprints of parameters (by layout name) the sender computed; a mismatch fails the commit.
  std::map<std::string, std::uint64_t> expected;
  // Writer fingerprints of the buckets written in place, in recording order, for entries that
  // had none (UpdateEngine::attach_direct_fingerprints); absent when the sender sent none.
  std::optional<std::vector<std::uint64_t>> writer_fingerprints;
  // With them: one list per writer fingerprint, the writing copy's chunk hashes of that entry
  // (UpdateEngine::attach_direct_fingerprints); empty when the sender sent none.
  std::vector<std::vector<std::uint64_t>> writer_chunk_hashes;
  // The label to publish with, where the source learned it only now (else the run's).
  std::optional<std::string> label;
};

// How a source's peer writes the parameters.
enum class Delivery {
  staged,                     // buckets of bytes, applied by the engine
  in_place,                   // written in place (UpdateEngine::begin_direct_writes(false))
  in_place_writer_prints,     // ... by a copy that fingerprints what it writes (true)
};

class BucketSource {
 public:
  virtual ~BucketSource() = default;

  // How the peer writes (asked once, after begin; in-place writes are declared before begun()).
  virtual Delivery delivery() const { return Delivery::staged; }
  // True: the loop asks for bucket k+1 while bucket k is applied (on another thread), and the
  // source fills the two slots 0 and 1 alternately (`slot` of next()). False: one bucket at a
  // time, each applied before the next is asked for.
  virtual bool double_buffered() const { return false; }

  // The update began: the source may let its peer send (staging, the session's Ready).
  virtual void begun() {}
  // The next bucket into `slot`, or false at the end of the update. Returns or throws (TIMEOUT
  // naming the peer) within the source's own deadline for one bucket; a source whose peer may
  // stall must have one. The bucket handed out before the previous one in the same slot was
  // applied (applied() returned) only when double_buffered().
  virtual bool next(std::uint32_t slot, Bucket& out) = 0;
  // On the applying thread, before the engine applies `bucket`: checks the source can make with
  // the manifest (decode it when needed: manifest::decode, once) and the fingerprints it computes
  // anyway (entry_fingerprints). A throw fails the update.
  virtual void verify(Bucket& /*bucket*/) {}
  // On the applying thread: the engine applied (or recorded) `bucket`; its memory may be reused.
  virtual void applied(const Bucket& /*bucket*/) {}
  // On the applying thread, at once when applying a bucket failed (the update ends): a source
  // whose next() may be waiting for its peer makes it return. Never throws.
  virtual void apply_failed(const Error& /*error*/) noexcept {}
  // After the last bucket was applied, before commit.
  virtual UpdateEnd end() { return {}; }
};

}  // namespace ferry::update
