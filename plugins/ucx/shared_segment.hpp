// plugins/ucx/shared_segment.hpp: the shared memory behind the plugin's alloc_memory, and a peer's
// mapping of it. The owner (a receiver) creates an anonymous memory file (memfd), sized, its pages
// allocated up front (fallocate) and sealed against shrinking and growing; a sender on the same
// host opens it through /proc/<owner pid>/fd/<fd>, checks it is that very file (device and inode
// from the key) and maps it. Every failure of that attach is an error code, never a signal: a
// gone owner makes the open fail, and once mapped the file stays alive (and its pages allocated)
// as long as this process maps it, whatever the owner does, so a copy into the mapping cannot
// fault (no SIGBUS: the seals forbid truncation; no SIGSEGV: nothing unmaps it but its holder).
// The plugin's earlier way, memory UCX allocated (ucp_mem_map ALLOCATE, sysv/posix) mapped by
// ucp_ep_rkey_unpack, crashed the sender inside UCX 1.13 when the owner died just before the
// unpack, and was offered only without UCX peer error handling.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::ucx {

// What a remote key carries to find the segment (all zero: no segment).
struct SegmentId {
  std::uint32_t pid = 0;  // the owner
  std::int32_t fd = -1;   // its descriptor of the memory file
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;  // bytes the owner mapped (the file is at least this long, sealed)
};

// The owner's side: a sealed memory file of `size` bytes mapped here. Throws ferry::Error
// (OUT_OF_MEMORY when the pages cannot be had, IO otherwise).
class OwnedSegment {
 public:
  explicit OwnedSegment(std::uint64_t size);
  ~OwnedSegment();
  OwnedSegment(const OwnedSegment&) = delete;
  OwnedSegment& operator=(const OwnedSegment&) = delete;
  void* data() const { return data_; }
  const SegmentId& id() const { return id_; }

 private:
  void* data_ = nullptr;
  std::uint64_t mapped_ = 0;
  int fd_ = -1;
  SegmentId id_;
};

// A peer's segment mapped into this process, unmapped by the destructor.
class MappedSegment {
 public:
  enum class Outcome {
    mapped,
    owner_gone,    // the owner's process no longer runs (or its descriptor is gone with it)
    not_that_file, // the owner runs but the descriptor is another file now (memory freed)
    refused,       // the open or the map was refused (permissions, limits): no copy path
  };
  MappedSegment() = default;
  MappedSegment(MappedSegment&& other) noexcept;
  MappedSegment& operator=(MappedSegment&& other) noexcept;
  ~MappedSegment();

  // Maps `id`'s segment; on anything but `mapped`, `why` says what happened.
  Outcome attach(const SegmentId& id, std::string* why);
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(data_); }
  std::uint64_t size() const { return size_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t mapped_ = 0;
};

}  // namespace ferry::ucx
