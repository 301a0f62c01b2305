// plugins/ucx/shared_segment.cpp: memfd segments for alloc_memory and their attachment by a peer
// on the same host (shared_segment.hpp).
#include "shared_segment.hpp"

#include "process_state.hpp"

#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace ferry::ucx {
namespace {

std::uint64_t page_rounded(std::uint64_t n) {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

OwnedSegment::OwnedSegment(std::uint64_t size) {
  mapped_ = page_rounded(size);
  fd_ = memfd_create("ferry-ucx-slot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) {
    fail(FERRY_STATUS_IO, "ucx alloc_memory of {} bytes: memfd_create: {}", size,
         std::strerror(errno));
  }
  const auto undo = [&](const char* step, int err) {
    ::close(fd_);
    fd_ = -1;
    fail(err == ENOMEM || err == ENOSPC ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_IO,
         "ucx alloc_memory of {} bytes: {}: {}", size, step, std::strerror(err));
  };
  if (ftruncate(fd_, static_cast<off_t>(mapped_)) != 0) undo("ftruncate", errno);
  // Every page now, so that no later write (ours or a peer's through its mapping) can find the
  // memory short: that would be a SIGBUS in whichever process wrote.
  if (const int err = posix_fallocate(fd_, 0, static_cast<off_t>(mapped_)); err != 0) {
    undo("fallocate", err);
  }
  if (fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    undo("sealing", errno);
  }
  struct stat st {};
  if (fstat(fd_, &st) != 0) undo("fstat", errno);
  data_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    undo("mmap", errno);
  }
  id_.pid = static_cast<std::uint32_t>(getpid());
  id_.fd = fd_;
  id_.device = static_cast<std::uint64_t>(st.st_dev);
  id_.inode = static_cast<std::uint64_t>(st.st_ino);
  id_.size = size;
}

OwnedSegment::~OwnedSegment() {
  if (data_ != nullptr) munmap(data_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

MappedSegment::MappedSegment(MappedSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

MappedSegment& MappedSegment::operator=(MappedSegment&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

MappedSegment::~MappedSegment() { reset(); }

void MappedSegment::reset() noexcept {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
}

MappedSegment::Outcome MappedSegment::attach(const SegmentId& id, std::string* why) {
  reset();
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/fd/%d", id.pid, id.fd);
  const auto gone_or_other = [&](const std::string& what) {
    if (process_gone(id.pid)) {
      *why = "process " + std::to_string(id.pid) + " is gone";
      return Outcome::owner_gone;
    }
    *why = what;
    return Outcome::not_that_file;
  };
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ESRCH) {
      return gone_or_other(std::string(path) + " does not exist (the memory was freed)");
    }
    *why = std::string("cannot open ") + path + ": " + std::strerror(err);
    return Outcome::refused;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    *why = std::string("fstat of ") + path + ": " + std::strerror(errno);
    ::close(fd);
    return Outcome::refused;
  }
  if (static_cast<std::uint64_t>(st.st_dev) != id.device ||
      static_cast<std::uint64_t>(st.st_ino) != id.inode) {
    ::close(fd);
    return gone_or_other(std::string(path) + " is another file now (the memory was freed)");
  }
  // Sealed against shrinking and at least as long as the key says: no access through the
  // mapping can fall beyond the file's end (SIGBUS).
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 ||
      static_cast<std::uint64_t>(st.st_size) < page_rounded(id.size)) {
    ::close(fd);
    *why = std::string(path) + " is not a sealed segment of the key's size";
    return Outcome::refused;
  }
  const std::uint64_t mapped = page_rounded(id.size);
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (data == MAP_FAILED) {
    *why = std::string("mmap of ") + path + ": " + std::strerror(err);
    return Outcome::refused;
  }
  data_ = data;
  size_ = id.size;
  mapped_ = mapped;
  return Outcome::mapped;
}

}  // namespace ferry::ucx
