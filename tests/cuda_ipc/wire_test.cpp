// tests/cuda_ipc/wire_test.cpp: the CUDA IPC transport's bytes without a GPU: address and key
// blobs round-trip and foreign or truncated blobs are refused, a key from another instance is
// refused as stale, and file descriptors pass between processes over a real Unix socket with
// SCM_RIGHTS (a memfd's contents read back through the received descriptor).
#include <gtest/gtest.h>

#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "ipc_wire.hpp"

namespace ferry::cuda_ipc {
namespace {

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

TEST(CudaIpcWire, AddressRoundTrips) {
  Address a{0x1234567890abcdefull, 4242, "node-7", "boot-uuid", "/tmp/x.sock"};
  const Address b = decode_address(encode_address(a));
  EXPECT_EQ(b.nonce, a.nonce);
  EXPECT_EQ(b.pid, 4242u);
  EXPECT_EQ(b.host, "node-7");
  EXPECT_EQ(b.boot_id, "boot-uuid");
  EXPECT_EQ(b.socket_path, "/tmp/x.sock");
}

TEST(CudaIpcWire, KeyRoundTrips) {
  const Key k{77, 5, 4096, 1ull << 33, ShareKind::Legacy};
  const auto bytes = encode_key(k);
  EXPECT_LE(bytes.size(), 64u);  // small: it travels in the session's Welcome
  const Key d = decode_key(bytes);
  EXPECT_EQ(d.owner, 77u);
  EXPECT_EQ(d.memory_id, 5u);
  EXPECT_EQ(d.offset, 4096u);
  EXPECT_EQ(d.size, 1ull << 33);
  EXPECT_EQ(d.kind, ShareKind::Legacy);
}

TEST(CudaIpcWire, ForeignAndTruncatedBlobsAreRefused) {
  const auto key = encode_key(Key{1, 2, 3, 4, ShareKind::Vmm});
  std::vector<std::uint8_t> truncated(key.begin(), key.end() - 3);
  EXPECT_EQ(code_of([&] { decode_key(truncated); }), FERRY_STATUS_CORRUPT_DATA);
  const auto address = encode_address(Address{1, 2, "h", "b", "/p"});
  std::string message;
  EXPECT_EQ(code_of([&] { decode_key(address); }, &message), FERRY_STATUS_INCOMPATIBLE);
  EXPECT_NE(message.find("not a cuda_ipc key"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { decode_address(key); }), FERRY_STATUS_INCOMPATIBLE);
  std::vector<std::uint8_t> bad_kind = key;
  bad_kind.back() = 9;
  EXPECT_EQ(code_of([&] { decode_key(bad_kind); }), FERRY_STATUS_CORRUPT_DATA);
  std::vector<std::uint8_t> longer = key;
  longer.push_back(0);
  EXPECT_EQ(code_of([&] { decode_key(longer); }), FERRY_STATUS_CORRUPT_DATA);
}

TEST(CudaIpcWire, KeyOfAnotherInstanceIsRefusedAsStale) {
  const Key k{0xaaaa, 3, 0, 100, ShareKind::Vmm};
  EXPECT_EQ(code_of([&] { check_key_owner(k, 0xaaaa, "receiver r1"); }), FERRY_STATUS_OK);
  std::string message;
  EXPECT_EQ(code_of([&] { check_key_owner(k, 0xbbbb, "receiver r1"); }, &message),
            FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(message.find("stale key"), std::string::npos) << message;
  EXPECT_NE(message.find("receiver r1"), std::string::npos) << message;
}

TEST(CudaIpcWire, FdPassesBetweenProcessesWithScmRights) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const std::string text = "weights through a memfd";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pair[0]);
    int code = 0;
    try {
      UniqueFd memfd(::memfd_create("cuda_ipc_test", MFD_CLOEXEC));
      if (!memfd || ::write(memfd.get(), text.data(), text.size()) !=
                        static_cast<ssize_t>(text.size())) {
        ::_exit(2);
      }
      send_frame(pair[1], Frame{MessageType::ImportReply, {1, 2, 3}, {memfd.get()}}, "parent");
    } catch (...) {
      code = 3;
    }
    ::_exit(code);  // the memfd lives on only through the descriptor in flight
  }
  ::close(pair[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  Frame frame = recv_frame(pair[0], monotonic_ns() + 10'000'000'000, "child");
  ::close(pair[0]);
  EXPECT_EQ(frame.type, MessageType::ImportReply);
  EXPECT_EQ(frame.payload, (std::vector<std::uint8_t>{1, 2, 3}));
  ASSERT_EQ(frame.fds.size(), 1u);
  UniqueFd received(frame.fds[0]);
  std::string read_back(text.size(), '\0');
  ASSERT_EQ(::pread(received.get(), read_back.data(), read_back.size(), 0),
            static_cast<ssize_t>(text.size()));
  EXPECT_EQ(read_back, text);
  EXPECT_NE(::fcntl(received.get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(CudaIpcWire, ClosedPeerAndSilentPeerAreReportedByName) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  std::string message;
  EXPECT_EQ(code_of([&] { recv_frame(pair[0], monotonic_ns() + 20'000'000, "sender s1"); },
                    &message),
            FERRY_STATUS_TIMEOUT);
  EXPECT_NE(message.find("sender s1"), std::string::npos) << message;
  ::close(pair[1]);
  EXPECT_EQ(code_of([&] { recv_frame(pair[0], monotonic_ns() + 10'000'000'000, "sender s1"); },
                    &message),
            FERRY_STATUS_PEER_FAILED);
  EXPECT_NE(message.find("sender s1 closed its connection"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { send_frame(pair[0], Frame{MessageType::Hello, {}, {}}, "sender s1"); },
                    &message),
            FERRY_STATUS_PEER_FAILED);
  ::close(pair[0]);
}

}  // namespace
}  // namespace ferry::cuda_ipc
