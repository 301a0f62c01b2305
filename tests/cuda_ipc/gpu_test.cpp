// tests/cuda_ipc/gpu_test.cpp: two processes on one GPU. This process is the sender; the
// receiver is cuda_ipc_peer (fork+exec, path in FERRY_CUDA_IPC_PEER), whose memory comes from
// ferry's CUDA weight store (VMM chunks shared as fds) or from cudaMalloc (legacy cudaIpc).
// Checked: direct puts across chunk boundaries and a staged ring are bit-identical; 100 transfers
// and 20 whole sessions grow neither open fds, nor mappings, nor used device memory; the legacy
// path with offsets inside one allocation; a key whose registration the receiver dropped is
// refused naming it; a restarted receiver's old key is refused as stale and
// the dead incarnation fails operations naming it; fingerprinting flushes in flight together keep
// the order of writes to the same bytes; put_many queues all of its puts or none. Exits 77 (skip)
// without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/kernels/cpu.hpp"
#include "plugin_client.hpp"
#include "store/cuda_weight_store.hpp"

namespace ferry::cuda_ipc::test {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// The receiver process and its command pipe.
class Peer {
 public:
  Peer() {
    const char* path = std::getenv("FERRY_CUDA_IPC_PEER");
    if (path == nullptr) fail(FERRY_STATUS_NOT_FOUND, "set FERRY_CUDA_IPC_PEER");
    int to_child[2];
    int from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      fail(FERRY_STATUS_IO, "pipe");
    }
    pid_ = ::fork();
    if (pid_ < 0) fail(FERRY_STATUS_IO, "fork");
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::execl(path, path, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  ~Peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (in_ != nullptr) ::fclose(in_);
    if (out_ != nullptr) ::fclose(out_);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void post(const std::string& command) {
    std::fprintf(in_, "%s\n", command.c_str());
    std::fflush(in_);
  }
  // The answer's value after "ok"; throws with the peer's message after "err".
  std::string answer() {
    char buffer[8192];
    if (std::fgets(buffer, sizeof buffer, out_) == nullptr) {
      fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc_peer exited without answering");
    }
    std::string line(buffer);
    while (!line.empty() && line.back() == '\n') line.pop_back();
    if (line.rfind("ok", 0) != 0) fail(FERRY_STATUS_INTERNAL, "cuda_ipc_peer: {}", line);
    return line.size() > 3 ? line.substr(3) : "";
  }
  std::string ask(const std::string& command) {
    post(command);
    return answer();
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

std::string args(std::initializer_list<std::uint64_t> values) {
  std::string s;
  for (auto v : values) s += " " + std::to_string(v);
  return s;
}

// Device memory of this process filled with pattern(seed).
struct LocalBuffer {
  explicit LocalBuffer(std::uint64_t bytes) : size(bytes) {
    if (cudaMalloc(&data, bytes) != cudaSuccess) fail(FERRY_STATUS_OUT_OF_MEMORY, "cudaMalloc");
  }
  ~LocalBuffer() { (void)cudaFree(data); }
  void fill(std::uint64_t seed, std::uint64_t offset, std::uint64_t length) {
    const auto p = pattern(seed, length);
    if (cudaMemcpy(static_cast<std::uint8_t*>(data) + offset, p.data(), length,
                   cudaMemcpyHostToDevice) != cudaSuccess) {
      fail(FERRY_STATUS_INTERNAL, "cudaMemcpy");
    }
  }
  void* data = nullptr;
  std::uint64_t size = 0;
};

std::uint64_t device_used() {
  std::size_t free = 0;
  std::size_t total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return total - free;
}

// Connects this sender and the peer both ways, as the session layer does.
void pair(Transport& sender, Peer& peer, const std::string& name) {
  sender.connect(unhex(peer.ask("address")), name);
  peer.ask("connect " + hex(sender.address()));
}

TEST(CudaIpcGpu, DirectPutsAcrossStoreChunksAreBitIdentical) {
  Peer peer;
  Transport sender(FERRY_ROLE_SENDER, 0);
  // 64 MiB in 16 MiB chunks: the registration spans four exported allocations.
  const auto key = unhex(peer.ask("store" + args({64 * kMiB, 16 * kMiB})));
  pair(sender, peer, "receiver 1");
  LocalBuffer local(64 * kMiB);
  local.fill(11, 0, 64 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  // Uneven pieces, several crossing a chunk boundary, written out of order.
  const std::uint64_t piece = 7 * kMiB + 123;
  std::vector<std::uint64_t> starts;
  for (std::uint64_t at = 0; at < 64 * kMiB; at += piece) starts.push_back(at);
  for (std::size_t i = starts.size(); i-- > 0;) {
    const std::uint64_t n = std::min(piece, 64 * kMiB - starts[i]);
    sender.put(m, starts[i], n, key, starts[i]);
  }
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 11, 0, 64 * kMiB})), "");
}

// Fingerprinting puts of consecutive flushes run on alternate streams (copy_lanes); two flushes
// in flight at once that write the same bytes must still land in order, and ones that write
// different bytes must both land, with the fingerprints of what they wrote.
TEST(CudaIpcGpu, FingerprintedFlushesInFlightTogetherKeepTheirOrder) {
  Peer peer;
  Transport sender(FERRY_ROLE_SENDER, 0);
  const auto key = unhex(peer.ask("store" + args({64 * kMiB, 16 * kMiB})));
  pair(sender, peer, "receiver 1");
  LocalBuffer local(96 * kMiB);
  local.fill(31, 0, 32 * kMiB);
  local.fill(32, 32 * kMiB, 32 * kMiB);
  local.fill(33, 64 * kMiB, 32 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  ferry_blob_t k = borrow(key);
  // Queues a fingerprinting put of local [from, +32 MiB) to remote [to, +32 MiB), then a flush
  // that is not waited for.
  std::vector<std::uint64_t> prints(3, 0);
  auto put_and_flush = [&](std::uint64_t from, std::uint64_t to, std::uint64_t* print) {
    ferry_put_args_t a{};
    a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, fingerprint_out);
    a.local = Transport::range(m, from, 32 * kMiB);
    a.remote_key = &k;
    a.remote_offset = to;
    a.deadline_ns = in_seconds(30);
    a.fingerprint_out = print;
    ferry_request_t* put = nullptr;
    throw_if_error(Transport::api()->put(sender.get(), sender.peer(), &a, &put), "put");
    EXPECT_EQ(put, nullptr);  // deferred: the flush reports it
    ferry_request_t* flush = nullptr;
    throw_if_error(Transport::api()->flush(sender.get(), sender.peer(), in_seconds(30), &flush),
                   "flush");
    return flush;
  };
  // Same bytes: the second flush's pattern 32 must win over the first's 31.
  ferry_request_t* first = put_and_flush(0, 0, &prints[0]);
  ferry_request_t* second = put_and_flush(32 * kMiB, 0, &prints[1]);
  // Other bytes: runs beside the second.
  ferry_request_t* third = put_and_flush(64 * kMiB, 32 * kMiB, &prints[2]);
  for (auto* r : {first, second, third}) {
    ErrorPtr e(Transport::api()->request_wait(sender.get(), r, in_seconds(60)));
    EXPECT_FALSE(e) << error_message(e.get());
    Transport::api()->request_free(sender.get(), r);
  }
  EXPECT_EQ(peer.ask("check" + args({0, 32, 0, 32 * kMiB})), "");
  EXPECT_EQ(peer.ask("check" + args({0, 33, 32 * kMiB, 32 * kMiB})), "");
  const auto expect_print = [](std::uint64_t seed) {
    const auto p = pattern(seed, 32 * kMiB);
    return ferry::kernels::fingerprint_cpu(p.data(), p.size(), 1);
  };
  EXPECT_EQ(prints[0], expect_print(31));
  EXPECT_EQ(prints[1], expect_print(32));
  EXPECT_EQ(prints[2], expect_print(33));
}

// put_many is all or nothing: a call with one bad put queues none, so the next flush writes
// nothing; a good call's puts all land.
TEST(CudaIpcGpu, PutManyQueuesAllOrNothing) {
  Peer peer;
  Transport sender(FERRY_ROLE_SENDER, 0);
  const auto key = unhex(peer.ask("store" + args({16 * kMiB, 16 * kMiB})));
  pair(sender, peer, "receiver 1");
  (void)peer.ask("fill" + args({0, 50, 0, 16 * kMiB}));
  LocalBuffer local(16 * kMiB);
  local.fill(51, 0, 16 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  ferry_blob_t k = borrow(key);
  std::vector<ferry_put_args_t> puts(4);
  for (std::size_t i = 0; i < puts.size(); ++i) {
    auto& a = puts[i];
    a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    a.local = Transport::range(m, i * 4 * kMiB, 4 * kMiB);
    a.remote_key = &k;
    a.remote_offset = i * 4 * kMiB;
    a.deadline_ns = in_seconds(30);
  }
  std::vector<const ferry_put_args_t*> pointers;
  for (const auto& a : puts) pointers.push_back(&a);
  ferry_put_args_t bad = puts[3];
  bad.remote_offset = 14 * kMiB;  // 4 MiB from here pass the 16 MiB
  pointers.back() = &bad;
  ErrorPtr refused(Transport::api()->put_many(sender.get(), sender.peer(), pointers.data(),
                                              pointers.size()));
  ASSERT_TRUE(refused);
  EXPECT_EQ(error_code(refused.get()), FERRY_STATUS_INVALID_ARGUMENT);
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 50, 0, 16 * kMiB})), "");  // untouched
  pointers.back() = &puts[3];
  ErrorPtr queued(Transport::api()->put_many(sender.get(), sender.peer(), pointers.data(),
                                             pointers.size()));
  EXPECT_FALSE(queued) << error_message(queued.get());
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 51, 0, 16 * kMiB})), "");
}

TEST(CudaIpcGpu, StagedRingIsBitIdenticalAndSlotsComeBack) {
  Peer peer;
  Transport sender(FERRY_ROLE_SENDER, 0);
  (void)peer.ask("store" + args({16 * kMiB, 4 * kMiB}));
  pair(sender, peer, "receiver 1");
  // The sender's ring: two staging slots in its own CUDA store (VMM, exported as fds).
  store::CudaWeightStoreOptions options;
  options.chunk_bytes = 4 * kMiB;
  store::CudaWeightStore staging(options);
  staging.place_all("staging", store::Policy::Discard,
                    std::vector<store::TensorSpec>{{"slot0", FERRY_DTYPE_U8, {8 * kMiB}},
                                                   {"slot1", FERRY_DTYPE_U8, {8 * kMiB}}});
  ferry_memory_t* slots[2];
  std::uint8_t* slot_data[2];
  for (int i = 0; i < 2; ++i) {
    const auto p = staging.param("slot" + std::to_string(i));
    slot_data[i] = reinterpret_cast<std::uint8_t*>(p.data);
    slots[i] = sender.register_memory(p.data, p.bytes, FERRY_MEMORY_CUDA);
  }
  for (std::uint32_t k = 0; k < 6; ++k) {
    const int slot = static_cast<int>(k % 2);
    const std::uint64_t bytes = 8 * kMiB - k * 4096;  // buckets of different sizes
    const auto p = pattern(100 + k, bytes);
    ASSERT_CUDA(cudaMemcpy(slot_data[slot], p.data(), bytes, cudaMemcpyHostToDevice));
    peer.post("recv" + args({0, k, 16 * kMiB}));
    ferry_request_t* sent = sender.send_bucket(slots[slot], bytes, k);
    // Completes only once the receiver copied the bucket out and released the slot.
    sender.finish(sent, "send_bucket " + std::to_string(k));
    EXPECT_EQ(peer.answer(), "");
    EXPECT_EQ(peer.ask("check" + args({0, 100 + k, 0, bytes})), "") << "bucket " << k;
  }
}

TEST(CudaIpcGpu, HundredTransfersAndTwentySessionsGrowNothing) {
  Peer peer;
  const auto key = unhex(peer.ask("store" + args({32 * kMiB, 8 * kMiB})));
  LocalBuffer local(32 * kMiB);
  local.fill(5, 0, 32 * kMiB);
  auto maps = [] {
    std::FILE* f = std::fopen("/proc/self/maps", "r");
    std::size_t lines = 0;
    for (int c = 0; f != nullptr && (c = std::fgetc(f)) != EOF;) lines += c == '\n';
    if (f != nullptr) std::fclose(f);
    return lines;
  };
  {
    Transport sender(FERRY_ROLE_SENDER, 0);
    pair(sender, peer, "receiver 1");
    ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
    sender.put(m, 0, local.size, key, 0);  // warm-up: the import happens here, once
    sender.flush();
    const std::size_t fds = open_fds();
    const std::size_t mapped = maps();
    const std::uint64_t used = device_used();
    const std::string peer_fds = peer.ask("fds");
    for (int i = 0; i < 100; ++i) {
      sender.put(m, 0, local.size, key, 0);
      sender.flush();
    }
    EXPECT_EQ(open_fds(), fds);
    EXPECT_EQ(maps(), mapped);
    EXPECT_EQ(device_used(), used);
    EXPECT_EQ(peer.ask("fds"), peer_fds);
    EXPECT_EQ(peer.ask("check" + args({0, 5, 0, 32 * kMiB})), "");
  }
  // Whole sessions: a new sender instance each time (imports, maps, unmaps on destroy). The
  // receiver keeps its instance; it only connects to the first sender.
  auto session = [&] {
    Transport sender(FERRY_ROLE_SENDER, 0);
    sender.connect(unhex(peer.ask("address")), "receiver 1");
    ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
    sender.put(m, 0, local.size, key, 0);
    sender.flush();
  };
  session();
  const std::size_t fds = open_fds();
  const std::size_t mapped = maps();
  const std::uint64_t used = device_used();
  const std::string peer_fds = peer.ask("fds");
  for (int i = 0; i < 20; ++i) session();
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(maps(), mapped);
  EXPECT_EQ(device_used(), used);
  // The receiver closes a finished sender's connection when it sees its end.
  std::string now = peer.ask("fds");
  for (int i = 0; i < 200 && now != peer_fds; ++i) {
    ::usleep(5000);
    now = peer.ask("fds");
  }
  EXPECT_EQ(now, peer_fds);
}

TEST(CudaIpcGpu, LegacyHandlesWithOffsetsInsideOneAllocation) {
  Peer peer;
  Transport sender(FERRY_ROLE_SENDER, 0);
  // Registrations 0 and 1 lie at inner offsets of one cudaMalloc allocation (one cudaIpc handle,
  // opened once here and shared); registration 2 is a second allocation.
  const auto key_a = unhex(peer.ask("legacy" + args({8 * kMiB, 4096, 1 * kMiB})));
  const auto key_b = unhex(peer.ask("sub" + args({0, 4 * kMiB + 512, 1 * kMiB})));
  const auto key_c = unhex(peer.ask("legacy" + args({4 * kMiB, 0, 1 * kMiB})));
  pair(sender, peer, "receiver 1");
  LocalBuffer local(3 * kMiB);
  local.fill(21, 0, 1 * kMiB);
  local.fill(22, 1 * kMiB, 1 * kMiB);
  local.fill(23, 2 * kMiB, 1 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  sender.put(m, 0, 1 * kMiB, key_a, 0);
  sender.put(m, 1 * kMiB, 1 * kMiB, key_b, 0);
  sender.put(m, 2 * kMiB, 1 * kMiB, key_c, 0);
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 21, 0, 1 * kMiB})), "");
  EXPECT_EQ(peer.ask("check" + args({1, 22, 0, 1 * kMiB})), "");
  EXPECT_EQ(peer.ask("check" + args({2, 23, 0, 1 * kMiB})), "");
  // Cached imports: the same keys again, in a new order, land in the same places.
  local.fill(24, 0, 1 * kMiB);
  sender.put(m, 0, 1 * kMiB, key_b, 0);
  sender.put(m, 0, 1 * kMiB, key_a, 0);
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 24, 0, 1 * kMiB})), "");
  EXPECT_EQ(peer.ask("check" + args({1, 24, 0, 1 * kMiB})), "");
}

// A put of `bytes` from the start of `m` to the start of the memory behind `key` (which must
// outlive the args), with a 10 s deadline: for calls that expect a refusal.
ferry_put_args_t whole_put(ferry_memory_t* m, std::uint64_t bytes, const ferry_blob_t& key) {
  ferry_put_args_t a{};
  a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
  a.local = Transport::range(m, 0, bytes);
  a.remote_key = &key;
  a.deadline_ns = in_seconds(10);
  return a;
}

TEST(CudaIpcGpu, AKeyWhoseRegistrationWasDroppedIsRefusedNamingIt) {
  Peer peer;
  const auto key = unhex(peer.ask("store" + args({4 * kMiB, 2 * kMiB})));
  Transport sender(FERRY_ROLE_SENDER, 0);
  pair(sender, peer, "receiver r");
  LocalBuffer local(4 * kMiB);
  local.fill(41, 0, 4 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  sender.put(m, 0, 4 * kMiB, key, 0);
  sender.flush();
  EXPECT_EQ(peer.ask("check" + args({0, 41, 0, 4 * kMiB})), "");
  // Its key was packed (offered): the receiver tells this sender when it deregisters it.
  ASSERT_EQ(peer.ask("drop" + args({0})), "");
  ferry_blob_t k = borrow(key);
  const ferry_put_args_t a = whole_put(m, 4 * kMiB, k);
  std::string message;
  ferry_status_code_t code = FERRY_STATUS_OK;
  // The Revoked message crosses the socket; until it arrived the put is queued (and flushed).
  for (int i = 0; i < 5000 && code == FERRY_STATUS_OK; ++i) {
    ferry_request_t* r = nullptr;
    ErrorPtr e(Transport::api()->put(sender.get(), sender.peer(), &a, &r));
    if (r != nullptr) Transport::api()->request_free(sender.get(), r);
    code = error_code(e.get());
    message = error_message(e.get());
    if (code == FERRY_STATUS_OK) {
      sender.flush();
      ::usleep(1000);
    }
  }
  EXPECT_EQ(code, FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(message.find("receiver r deregistered its memory"), std::string::npos) << message;
}

TEST(CudaIpcGpu, RestartedReceiversOldKeyIsRefused) {
  Transport sender(FERRY_ROLE_SENDER, 0);
  LocalBuffer local(4 * kMiB);
  local.fill(31, 0, 4 * kMiB);
  ferry_memory_t* m = sender.register_memory(local.data, local.size, FERRY_MEMORY_CUDA);
  auto first = std::make_unique<Peer>();
  const auto old_key = unhex(first->ask("store" + args({4 * kMiB, 2 * kMiB})));
  pair(sender, *first, "receiver incarnation 1");
  sender.put(m, 0, 4 * kMiB, old_key, 0);
  sender.flush();
  first->kill_now();
  // The dead incarnation: operations on it fail naming it (once its socket's end was seen).
  std::string message;
  ferry_status_code_t code = FERRY_STATUS_OK;
  for (int i = 0; i < 2000 && code == FERRY_STATUS_OK; ++i) {
    ferry_request_t* r = nullptr;
    ErrorPtr e(Transport::api()->flush(sender.get(), sender.peer(), in_seconds(10), &r));
    if (!e && r != nullptr) e.reset(Transport::api()->request_wait(sender.get(), r, in_seconds(10)));
    if (r != nullptr) Transport::api()->request_free(sender.get(), r);
    code = error_code(e.get());
    message = error_message(e.get());
    if (code == FERRY_STATUS_OK) ::usleep(1000);
  }
  EXPECT_EQ(code, FERRY_STATUS_PEER_FAILED);
  EXPECT_NE(message.find("receiver incarnation 1"), std::string::npos) << message;
  sender.disconnect();

  Peer second;
  const auto new_key = unhex(second.ask("store" + args({4 * kMiB, 2 * kMiB})));
  pair(sender, second, "receiver incarnation 2");
  ferry_blob_t k = borrow(old_key);
  const ferry_put_args_t a = whole_put(m, 4 * kMiB, k);
  ferry_request_t* r = nullptr;
  ErrorPtr e(Transport::api()->put(sender.get(), sender.peer(), &a, &r));
  ASSERT_TRUE(e);
  EXPECT_EQ(error_code(e.get()), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(error_message(e.get()).find("stale key"), std::string::npos) << error_message(e.get());
  EXPECT_EQ(r, nullptr);
  // The new incarnation's key works.
  sender.put(m, 0, 4 * kMiB, new_key, 0);
  sender.flush();
  EXPECT_EQ(second.ask("check" + args({0, 31, 0, 4 * kMiB})), "");
}

}  // namespace
}  // namespace ferry::cuda_ipc::test
