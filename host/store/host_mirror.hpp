// store/host_mirror.hpp: the host mirror, one copy of a set of parameters in host memory
// (anonymous, or file-backed under /dev/shm), serving backup on release, rollback of a failed
// in-place update, and restart without the trainer.
//
// Memory layout (the same for both kinds, so a file can be reopened by a later process):
//
//   [header 128 B][label 256 B][state: per entry {u64 fingerprint, u64 filled}][table][metadata]
//   [pad][data: entry 0 | entry 1 | ...]  (the data area starts at header_bytes, a multiple of
//                                         4096; each entry is 256-byte aligned)
//
// The header records a magic, a format version, the sizes, an xxh64 of the parameter table
// (name, tag, dtype, shape, offset, bytes of every entry) and of the owner's metadata (opaque
// bytes: the receiver keeps the checkpoint catalog there), and the committed weight version with
// the time it was recorded and an xxh64 of that record (version, time, label, every entry's
// fingerprint). open_file() validates all of it before trusting a byte, refuses a
// file whose layout differs from the expected one with a message naming the first difference, and
// holds an exclusive lock (flock) on the file while the mirror lives: a second process opening or
// replacing a mirror in use is refused.
//
// Committed version protocol: clear_committed() before the slots are overwritten, set_committed()
// after the copy finished, so a process that dies mid-copy leaves a mirror that says it holds no
// committed weights (never a torn one that claims a version). clear_committed() takes a note
// (e.g. "the copy of version 7 began and did not finish") that uncommitted_reason() returns, also
// after a reopen, so a restart can say why there is nothing to restore.
//
// Threading: not thread-safe; the owning store serializes calls. The copies themselves run on
// `threads` worker threads (chunked memcpy).
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ferry::store {

// One parameter the mirror holds a copy of.
struct MirrorParam {
  std::string name;
  std::string tag;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

struct MirrorEntry {
  MirrorParam param;
  std::uint64_t offset = 0;  // bytes from the start of the data area
  std::uint64_t bytes = 0;
};

struct CommittedVersion {
  std::uint64_t number = 0;
  std::string label;
  friend bool operator==(const CommittedVersion&, const CommittedVersion&) = default;
};

// One memcpy job; host memory on both sides.
struct CopyJob {
  void* dst = nullptr;
  const void* src = nullptr;
  std::uint64_t bytes = 0;
};

// Runs `jobs`, split into chunks, on up to `threads` threads (0: the hardware count). Small
// totals are copied on the calling thread.
void copy_parallel(std::span<const CopyJob> jobs, unsigned threads = 0);

// Longest label (and note, see clear_committed) the mirror records (bytes).
inline constexpr std::size_t kMirrorLabelMax = 255;
// Largest owner metadata a mirror file keeps (bytes).
inline constexpr std::size_t kMirrorMetadataMax = 64u << 20;

class HostMirror {
 public:
  // Anonymous memory (CPU: an anonymous mapping; a CUDA store would page-lock it).
  static std::unique_ptr<HostMirror> anonymous(std::vector<MirrorParam> layout,
                                               unsigned threads = 0);
  // Creates (replacing any old file) a file-backed mirror at `path` (normally under /dev/shm).
  // The file is written under a temporary name and renamed into place once its header is
  // complete. `metadata`: the owner's bytes, kept with the table (at most kMirrorMetadataMax).
  // Throws IO naming the path, FAILED_PRECONDITION when a mirror file at `path` is held by a
  // running process (its lock).
  static std::unique_ptr<HostMirror> create_file(const std::filesystem::path& path,
                                                 std::vector<MirrorParam> layout,
                                                 unsigned threads = 0,
                                                 std::string_view metadata = {});
  // Reopens a file written by create_file (possibly by another process). Validates the header,
  // the table and the committed version's record (CORRUPT_DATA naming the path and what is
  // wrong) and, when `expected` is given, that the layout equals it (INCOMPATIBLE naming the
  // first difference). NOT_FOUND when absent; FAILED_PRECONDITION when a running process holds
  // it.
  static std::unique_ptr<HostMirror> open_file(const std::filesystem::path& path,
                                               const std::vector<MirrorParam>* expected = nullptr,
                                               unsigned threads = 0);

  ~HostMirror();
  HostMirror(const HostMirror&) = delete;
  HostMirror& operator=(const HostMirror&) = delete;

  bool file_backed() const noexcept { return !path_.empty(); }
  const std::filesystem::path& path() const noexcept { return path_; }
  const std::vector<MirrorEntry>& entries() const noexcept { return entries_; }
  std::optional<std::size_t> find(std::string_view name) const;
  std::uint64_t data_bytes() const noexcept { return data_bytes_; }
  // The owner's metadata given to create_file (empty for an anonymous mirror).
  const std::string& metadata() const noexcept { return metadata_; }
  // The data area: data_bytes() bytes starting page-aligned, holding every slot (a CUDA store
  // page-locks exactly this range).
  std::byte* data_area() noexcept { return base_ + header_bytes_; }

  // Throws INCOMPATIBLE naming the first difference between entries() and `layout`.
  void check_layout(std::span<const MirrorParam> layout) const;

  // The bytes of entry `index` (entries()[index].bytes long).
  std::byte* slot(std::size_t index);
  const std::byte* slot(std::size_t index) const;

  // Whether entry `index` holds a copy (set by save or mark_filled, cleared by clear_filled).
  bool filled(std::size_t index) const;
  void clear_filled(std::size_t index);
  // For a store that copies into slot() itself (e.g. from device memory): clear_filled before
  // the copy starts, mark_filled once it has finished.
  void mark_filled(std::size_t index);

  // Copies `sources[i]` (entries()[entry[i]].bytes bytes each, host memory) into the slots and
  // marks those entries filled.
  void save(std::span<const std::size_t> entry, std::span<const std::byte* const> sources);
  // Copies the slots back into `targets`. FAILED_PRECONDITION naming the first entry that holds
  // no copy (nothing is copied then).
  void restore(std::span<const std::size_t> entry, std::span<std::byte* const> targets) const;

  // The version whose weights the filled entries hold, when one was recorded.
  std::optional<CommittedVersion> committed() const;
  // When the committed version was recorded (set_committed); the epoch when none is.
  std::chrono::system_clock::time_point committed_at() const;
  // Records `version` and the fingerprints (one per entry, entries() order; 0 for entries not
  // part of the version), stamped with the time now. The label is truncated to kMirrorLabelMax
  // bytes.
  void set_committed(const CommittedVersion& version, std::span<const std::uint64_t> fingerprints);
  // The mirror claims no version from here on. `note` says why (what is about to happen or what
  // went wrong), truncated to kMirrorLabelMax bytes; uncommitted_reason() returns it.
  void clear_committed(std::string_view note = {}) noexcept;
  // Why no version is committed: the last clear_committed note, or that the mirror never held
  // one. Empty while a version is committed.
  std::string uncommitted_reason() const;
  // The fingerprint recorded for entry `index` by set_committed (0 when none).
  std::uint64_t fingerprint(std::size_t index) const;

 private:
  HostMirror() = default;
  static std::unique_ptr<HostMirror> build(std::vector<MirrorParam> layout, unsigned threads,
                                           int fd, const std::filesystem::path& path,
                                           std::string_view metadata);
  // xxh64 of the committed version's record (see the file comment).
  std::uint64_t commit_record_hash() const;

  std::filesystem::path path_;  // empty for anonymous
  std::vector<MirrorEntry> entries_;
  // Each entry's index by name (views of entries_' names, which never change once laid out or
  // read): find() is called per parameter at every commit's refresh.
  std::unordered_map<std::string_view, std::size_t> index_;
  void index_entries();
  std::byte* base_ = nullptr;  // the whole mapping
  std::uint64_t mapping_bytes_ = 0;
  std::uint64_t header_bytes_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::string metadata_;
  unsigned threads_ = 0;
  int lock_fd_ = -1;  // file-backed: the open file whose flock marks the mirror in use
};

}  // namespace ferry::store
