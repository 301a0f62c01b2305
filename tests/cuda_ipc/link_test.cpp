// tests/cuda_ipc/link_test.cpp: the CUDA IPC control plane without a GPU, over real Unix sockets:
// staged-bucket announcements and releases reach the peer's link, imports carry memfd handles
// through the endpoint, keys of another instance and unknown registrations are refused with a
// message, a peer on another node is refused, a killed peer process fails every wait naming it,
// and many sessions leave no file descriptor behind.
#include <gtest/gtest.h>

#include <ferry/sdk/error.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "ipc_link.hpp"

namespace ferry::cuda_ipc {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

std::string socket_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

std::size_t open_fds() {
  std::size_t n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n;
}

template <typename Fn>
ferry_status_code_t code_of(Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.code();
  }
  return FERRY_STATUS_OK;
}

// Shares registration 7 as a memfd holding "id=7"; refuses every other id.
Endpoint::ImportAnswer memfd_handler(std::uint64_t id) {
  if (id != 7) fail(FERRY_STATUS_FAILED_PRECONDITION, "memory {} is not registered", id);
  UniqueFd fd(::memfd_create("link_test", MFD_CLOEXEC));
  const std::string text = "id=7";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    fail(FERRY_STATUS_IO, "memfd write");
  }
  Endpoint::ImportAnswer a;
  a.body = PayloadWriter().u64(id).take();
  a.fds.push_back(std::move(fd));
  return a;
}

TEST(CudaIpcLink, StagedAnnouncementsAndReleasesReachThePeer) {
  Endpoint sender(socket_dir(), random_nonce(), memfd_handler);
  Endpoint receiver(socket_dir(), random_nonce(), memfd_handler);
  auto to_receiver = sender.connect(receiver.address(), "receiver r", monotonic_ns() + 10 * kSecond);
  auto to_sender = receiver.connect(sender.address(), "sender s", monotonic_ns() + 10 * kSecond);
  to_receiver->send(Frame{MessageType::BucketReady,
                          PayloadWriter().u32(3).u64(7).u64(256).u64(1000).take(), {}});
  const BucketReady ready = to_sender->wait_ready(3, monotonic_ns() + 10 * kSecond);
  EXPECT_EQ(ready.index, 3u);
  EXPECT_EQ(ready.memory_id, 7u);
  EXPECT_EQ(ready.offset, 256u);
  EXPECT_EQ(ready.size, 1000u);
  EXPECT_FALSE(to_sender->take_ready(3).has_value());  // taken once
  EXPECT_FALSE(to_receiver->take_released(3));
  to_sender->send(Frame{MessageType::BucketReleased, PayloadWriter().u32(3).take(), {}});
  to_receiver->wait_released(3, monotonic_ns() + 10 * kSecond);
  std::string message;
  EXPECT_EQ(code_of([&] { to_receiver->wait_released(4, monotonic_ns() + 20'000'000); }, &message),
            FERRY_STATUS_TIMEOUT);
  EXPECT_NE(message.find("receiver r"), std::string::npos) << message;
}

TEST(CudaIpcLink, ImportCarriesTheOwnersDescriptor) {
  Endpoint owner(socket_dir(), random_nonce(), memfd_handler);
  Endpoint user(socket_dir(), random_nonce(), memfd_handler);
  auto link = user.connect(owner.address(), "receiver r", monotonic_ns() + 10 * kSecond);
  Frame reply = link->import(owner.nonce(), 7, monotonic_ns() + 10 * kSecond);
  ASSERT_EQ(reply.fds.size(), 1u);
  UniqueFd fd(reply.fds[0]);
  PayloadReader body(reply.payload, "reply");
  EXPECT_EQ(body.u64(), 7u);
  std::string text(4, '\0');
  ASSERT_EQ(::pread(fd.get(), text.data(), 4, 0), 4);
  EXPECT_EQ(text, "id=7");
}

TEST(CudaIpcLink, StaleAndUnknownRegistrationsAreRefusedWithAMessage) {
  Endpoint owner(socket_dir(), random_nonce(), memfd_handler);
  Endpoint user(socket_dir(), random_nonce(), memfd_handler);
  auto link = user.connect(owner.address(), "receiver r", monotonic_ns() + 10 * kSecond);
  std::string message;
  // A key packed by an earlier incarnation names another owner nonce.
  EXPECT_EQ(code_of([&] { link->import(owner.nonce() ^ 1, 7, monotonic_ns() + 10 * kSecond); },
                    &message),
            FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(message.find("stale key"), std::string::npos) << message;
  EXPECT_NE(message.find("receiver r refused"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { link->import(owner.nonce(), 8, monotonic_ns() + 10 * kSecond); },
                    &message),
            FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(message.find("memory 8 is not registered"), std::string::npos) << message;
  // The link stays usable after a refusal.
  Frame reply = link->import(owner.nonce(), 7, monotonic_ns() + 10 * kSecond);
  ASSERT_EQ(reply.fds.size(), 1u);
  ::close(reply.fds[0]);
}

TEST(CudaIpcLink, RevokedRegistrationIsSeenByThePeer) {
  Endpoint owner(socket_dir(), random_nonce(), memfd_handler);
  Endpoint user(socket_dir(), random_nonce(), memfd_handler);
  auto to_owner = user.connect(owner.address(), "receiver r", monotonic_ns() + 10 * kSecond);
  auto to_user = owner.connect(user.address(), "sender s", monotonic_ns() + 10 * kSecond);
  EXPECT_FALSE(to_owner->revoked(7));
  to_user->send(Frame{MessageType::Revoked, PayloadWriter().u64(7).take(), {}});
  // An announcement sent after it on the same socket proves the Revoked was handled first.
  to_user->send(Frame{MessageType::BucketReady,
                      PayloadWriter().u32(0).u64(1).u64(0).u64(1).take(), {}});
  (void)to_owner->wait_ready(0, monotonic_ns() + 10 * kSecond);
  EXPECT_TRUE(to_owner->revoked(7));
  EXPECT_FALSE(to_owner->revoked(8));
}

TEST(CudaIpcLink, PeerOnAnotherNodeIsRefused) {
  Endpoint self(socket_dir(), random_nonce(), memfd_handler);
  Address remote = self.address();
  remote.boot_id = "another-machine";
  std::string message;
  EXPECT_EQ(code_of([&] { self.connect(remote, "receiver far", monotonic_ns() + kSecond); },
                    &message),
            FERRY_STATUS_INCOMPATIBLE);
  EXPECT_NE(message.find("same-node only"), std::string::npos) << message;
}

TEST(CudaIpcLink, KilledPeerFailsEveryWaitNamingIt) {
  int to_child[2];
  int to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  // Fork before this process starts any thread (the endpoint's service thread).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    Endpoint peer(socket_dir(), random_nonce(), memfd_handler);
    std::uint32_t length = 0;
    if (::read(to_child[0], &length, 4) != 4) ::_exit(2);
    std::vector<std::uint8_t> bytes(length);
    if (::read(to_child[0], bytes.data(), length) != static_cast<ssize_t>(length)) ::_exit(2);
    auto link = peer.connect(decode_address(bytes), "parent", monotonic_ns() + 10 * kSecond);
    const auto mine = encode_address(peer.address());
    const auto mine_length = static_cast<std::uint32_t>(mine.size());
    if (::write(to_parent[1], &mine_length, 4) != 4 ||
        ::write(to_parent[1], mine.data(), mine.size()) != static_cast<ssize_t>(mine.size())) {
      ::_exit(2);
    }
    ::pause();  // until killed
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  Endpoint self(socket_dir(), random_nonce(), memfd_handler);
  const auto mine = encode_address(self.address());
  const auto mine_length = static_cast<std::uint32_t>(mine.size());
  ASSERT_EQ(::write(to_child[1], &mine_length, 4), 4);
  ASSERT_EQ(::write(to_child[1], mine.data(), mine.size()), static_cast<ssize_t>(mine.size()));
  std::uint32_t length = 0;
  ASSERT_EQ(::read(to_parent[0], &length, 4), 4);
  std::vector<std::uint8_t> bytes(length);
  ASSERT_EQ(::read(to_parent[0], bytes.data(), length), static_cast<ssize_t>(length));
  auto link = self.connect(decode_address(bytes), "receiver pid " + std::to_string(child),
                           monotonic_ns() + 10 * kSecond);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::string message;
  // The deadline is far away: the wait must end because the peer died, not because of time.
  EXPECT_EQ(code_of([&] { link->wait_released(0, monotonic_ns() + 60 * kSecond); }, &message),
            FERRY_STATUS_PEER_FAILED);
  EXPECT_NE(message.find("receiver pid " + std::to_string(child)), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { link->wait_ready(0, monotonic_ns() + 60 * kSecond); }),
            FERRY_STATUS_PEER_FAILED);
  EXPECT_EQ(code_of([&] { link->import(link->remote().nonce, 7, monotonic_ns() + 60 * kSecond); }),
            FERRY_STATUS_PEER_FAILED);
  ::close(to_child[1]);
  ::close(to_parent[0]);
}

TEST(CudaIpcLink, AbortEndsWaitsWithItsReason) {
  Endpoint a(socket_dir(), random_nonce(), memfd_handler);
  Endpoint b(socket_dir(), random_nonce(), memfd_handler);
  auto link = a.connect(b.address(), "receiver r", monotonic_ns() + 10 * kSecond);
  a.abort("trainer gave up");
  std::string message;
  EXPECT_EQ(code_of([&] { link->wait_released(1, monotonic_ns() + 60 * kSecond); }, &message),
            FERRY_STATUS_ABORTED);
  EXPECT_NE(message.find("trainer gave up"), std::string::npos) << message;
}

TEST(CudaIpcLink, ManySessionsLeaveNoDescriptorsBehind) {
  Endpoint receiver(socket_dir(), random_nonce(), memfd_handler);
  auto session = [&] {
    Endpoint sender(socket_dir(), random_nonce(), memfd_handler);
    auto link = sender.connect(receiver.address(), "receiver r", monotonic_ns() + 10 * kSecond);
    Frame reply = link->import(receiver.nonce(), 7, monotonic_ns() + 10 * kSecond);
    for (int fd : reply.fds) ::close(fd);
  };
  auto settle = [&] {
    // The receiver's service thread closes a finished sender's connection when it sees EOF.
    for (int i = 0; i < 1000 && receiver.incoming_count() != 0; ++i) ::usleep(1000);
  };
  session();  // warm-up: first-use allocations
  settle();
  const std::size_t before = open_fds();
  for (int i = 0; i < 50; ++i) session();
  settle();
  EXPECT_EQ(receiver.incoming_count(), 0u);
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace ferry::cuda_ipc
