// tests/ucx/shared_segment_test.cpp: the UCX plugin's alloc_memory segments (memfd) and their
// mapping by another process (plugins/ucx/shared_segment.hpp): a mapping made while the owner
// ran stays readable and writable after the owner is SIGKILLed and reaped (what keeps a sender's
// copy from faulting when its receiver dies mid-put); attaching after the owner is gone, or to a
// freed segment, or to another file now behind the same descriptor, is an outcome, not a crash.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "plugins/ucx/shared_segment.hpp"

namespace ferry::ucx {
namespace {

constexpr std::uint64_t kSize = 8ull << 20;

std::uint8_t byte_at(std::uint64_t i, std::uint8_t seed) {
  return static_cast<std::uint8_t>((i * 131 + seed) >> 3);
}

TEST(SharedSegment, MappingStaysValidAfterTheOwnerIsKilled) {
  int ids[2];
  ASSERT_EQ(pipe(ids), 0);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    OwnedSegment segment(kSize);
    auto* p = static_cast<std::uint8_t*>(segment.data());
    for (std::uint64_t i = 0; i < kSize; ++i) p[i] = byte_at(i, 1);
    const SegmentId id = segment.id();
    if (write(ids[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) _exit(1);
    pause();  // killed here
    _exit(0);
  }
  ::close(ids[1]);
  SegmentId id;
  ASSERT_EQ(read(ids[0], &id, sizeof id), static_cast<ssize_t>(sizeof id));
  ::close(ids[0]);
  EXPECT_EQ(id.pid, static_cast<std::uint32_t>(owner));

  MappedSegment mapped;
  std::string why;
  ASSERT_EQ(mapped.attach(id, &why), MappedSegment::Outcome::mapped) << why;
  ASSERT_EQ(mapped.size(), kSize);
  EXPECT_EQ(mapped.data()[kSize - 1], byte_at(kSize - 1, 1));

  ASSERT_EQ(kill(owner, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(owner, &status, 0), owner);
  ASSERT_TRUE(WIFSIGNALED(status));

  // The owner is gone and reaped: its pages live on in this mapping, every byte of it.
  std::uint8_t* p = mapped.data();
  for (std::uint64_t i = 0; i < kSize; i += 4096) ASSERT_EQ(p[i], byte_at(i, 1)) << i;
  for (std::uint64_t i = 0; i < kSize; ++i) p[i] = byte_at(i, 2);
  for (std::uint64_t i = 0; i < kSize; ++i) ASSERT_EQ(p[i], byte_at(i, 2)) << i;

  // A new attach to the dead owner's segment: the owner is gone, said so.
  MappedSegment late;
  EXPECT_EQ(late.attach(id, &why), MappedSegment::Outcome::owner_gone);
  EXPECT_NE(why.find(std::to_string(owner)), std::string::npos) << why;
  EXPECT_EQ(late.data(), nullptr);
}

TEST(SharedSegment, AFreedSegmentOrAnotherFileBehindItsDescriptorIsNotMapped) {
  SegmentId freed;
  {
    OwnedSegment segment(kSize);
    freed = segment.id();
  }
  MappedSegment mapped;
  std::string why;
  EXPECT_EQ(mapped.attach(freed, &why), MappedSegment::Outcome::not_that_file);
  EXPECT_FALSE(why.empty());
  // A new segment, most likely on the same descriptor number: the old key does not reach it.
  OwnedSegment other(kSize);
  EXPECT_EQ(mapped.attach(freed, &why), MappedSegment::Outcome::not_that_file) << why;
  EXPECT_EQ(mapped.data(), nullptr);
  // Its own id maps, and writes through either mapping are seen by the other.
  ASSERT_EQ(mapped.attach(other.id(), &why), MappedSegment::Outcome::mapped) << why;
  mapped.data()[123] = 77;
  EXPECT_EQ(static_cast<std::uint8_t*>(other.data())[123], 77);
}

TEST(SharedSegment, SizesAreRoundedAndAligned) {
  OwnedSegment segment(4097);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(segment.data()) % 4096, 0u);
  EXPECT_EQ(segment.id().size, 4097u);
  MappedSegment mapped;
  std::string why;
  ASSERT_EQ(mapped.attach(segment.id(), &why), MappedSegment::Outcome::mapped) << why;
  mapped.data()[4096] = 9;
  EXPECT_EQ(static_cast<std::uint8_t*>(segment.data())[4096], 9);
}

}  // namespace
}  // namespace ferry::ucx
