// tests/nccl/comm_smoke_test.cpp: a one-rank weight-update group on one GPU through the plugin's
// C table and BroadcastGroup (world_size 1; NCCL refuses two ranks on one GPU): init, a bucket
// broadcast to itself arrives intact, async completion polled with request_test, abort fails
// the next broadcast, re-init after the failure destroys the stale communicator first, destroy.
// Exits 77 (meson's skip code) with a message when no GPU is present. NCCL_NVLS_ENABLE=0.
#include <cuda_runtime.h>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "load_plugin.hpp"
#include "group/broadcast_group.hpp"
#include "group/group_table.hpp"
#include "tests/common/gpu_test_main.hpp"

namespace ferry::nccl {
namespace {

using namespace std::chrono_literals;

GroupInit one_rank(const std::string& name) {
  GroupInit init;
  init.master_address = "127.0.0.1";
  init.master_port = 0;  // world_size 1: nobody joins; any free port
  init.world_size = 1;
  init.group_name = name;
  init.rank = 0;
  init.device = 0;
  init.init_timeout = 60s;
  return init;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(x >> 24);
  }
  return v;
}

// Broadcasts `bytes` of a pattern through `group` and returns what is in the buffer after.
std::vector<std::uint8_t> broadcast_pattern(BroadcastGroup& group, std::size_t bytes,
                                            unsigned seed) {
  DeviceBuffer buffer(bytes);
  const auto sent = pattern(bytes, seed);
  EXPECT_EQ(cudaMemcpy(buffer.ptr, sent.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ferry_memory_t* memory = group.register_device(buffer.ptr, bytes);
  auto pending = group.issue(memory, 0, bytes, 0, 60s);
  group.wait(pending);
  std::vector<std::uint8_t> got(bytes);
  EXPECT_EQ(cudaMemcpy(got.data(), buffer.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

TEST(NcclOneRank, BroadcastsABucketToItselfIntact) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  BroadcastGroup group(api, host_api_table(), one_rank("smoke"));
  const std::size_t bytes = 64u << 20;
  EXPECT_EQ(broadcast_pattern(group, bytes, 1), pattern(bytes, 1));
}

TEST(NcclOneRank, CompletionIsPolledThroughRequestTest) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  // The plugin's own table, without BroadcastGroup: get_address, connect, send, test.
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_SENDER;
  args.device = 0;
  ferry_transport_t* t = nullptr;
  ErrorPtr e(api->create(&args, &t));
  ASSERT_FALSE(e) << error_message(e.get());
  ferry_blob_t id{};
  id.struct_size = sizeof id;
  e.reset(api->get_address(t, &id));
  ASSERT_FALSE(e) << error_message(e.get());
  EXPECT_EQ(id.size, 128u);
  id.release(id.data, id.release_ctx);
  ferry_connect_args_t c{};
  c.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
  c.local_rank = 0;
  c.group_size = 1;
  c.peer_name = "poll";
  c.deadline_ns = monotonic_ns() + 60'000'000'000;
  ferry_peer_t* peer = nullptr;
  e.reset(api->connect(t, &c, &peer));
  ASSERT_FALSE(e) << error_message(e.get());

  DeviceBuffer buffer(1 << 20);
  ferry_memory_desc_t desc{};
  desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
  desc.base = buffer.ptr;
  desc.size = 1 << 20;
  desc.kind = FERRY_MEMORY_CUDA;
  ferry_memory_t* memory = nullptr;
  e.reset(api->register_memory(t, &desc, &memory));
  ASSERT_FALSE(e) << error_message(e.get());

  // A receive on rank 0 is refused: rank 0 sends.
  ferry_bucket_io_t io{};
  io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
  io.data = ferry_memory_range_t{sizeof(ferry_memory_range_t), memory, 0, 1 << 20};
  io.bucket_index = 7;
  io.deadline_ns = monotonic_ns() + 60'000'000'000;
  ferry_request_t* request = nullptr;
  e.reset(api->recv_bucket(t, peer, &io, &request));
  ASSERT_TRUE(e);
  EXPECT_EQ(error_code(e.get()), FERRY_STATUS_FAILED_PRECONDITION);

  // A range past the registration is refused.
  io.data.offset = 1;
  e.reset(api->send_bucket(t, peer, &io, &request));
  ASSERT_TRUE(e);
  EXPECT_EQ(error_code(e.get()), FERRY_STATUS_INVALID_ARGUMENT);

  io.data.offset = 0;
  e.reset(api->send_bucket(t, peer, &io, &request));
  ASSERT_FALSE(e) << error_message(e.get());
  int done = 0;
  long polls = 0;
  while (!done) {
    e.reset(api->request_test(t, request, &done));
    ASSERT_FALSE(e) << error_message(e.get());
    ++polls;
  }
  EXPECT_EQ(done, 1);
  EXPECT_GE(polls, 1);
  api->request_free(t, request);
  api->deregister_memory(t, memory);
  api->disconnect(t, peer);
  api->destroy(t);
}

TEST(NcclOneRank, AbortFailsTheNextBroadcastAndReinitReplacesTheStaleCommunicator) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  GroupTable<BroadcastGroup> groups;
  auto make = [&] { return std::make_unique<BroadcastGroup>(api, host_api_table(), one_rank("g")); };
  BroadcastGroup& first = groups.init("g", make);
  first.abort("test abort");
  DeviceBuffer buffer(1 << 20);
  ferry_memory_t* memory = first.register_device(buffer.ptr, 1 << 20);
  try {
    auto pending = first.issue(memory, 0, 1 << 20, 0, 60s);
    first.wait(pending);
    FAIL() << "a broadcast on an aborted communicator succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_ABORTED) << e.what();
    EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
  }
  groups.mark_failed("g", "the test aborted it");
  EXPECT_THROW(groups.ready("g"), Error);
  // (The new group may reuse the stale one's address: the state, not the address, tells.)
  BroadcastGroup& second = groups.init("g", make);
  EXPECT_EQ(groups.state("g"), GroupState::ready);
  const std::size_t bytes = 4u << 20;
  EXPECT_EQ(broadcast_pattern(second, bytes, 9), pattern(bytes, 9));
  groups.destroy("g");
  EXPECT_FALSE(groups.contains("g"));
}

TEST(NcclOneRank, InitTimesOutNamingTheRankThatNeverJoined) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  GroupInit init = one_rank("lonely");
  init.world_size = 2;  // rank 1 never comes
  init.init_timeout = 1s;
  try {
    BroadcastGroup group(api, host_api_table(), init);
    FAIL() << "init of a group with a missing rank succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("rank 1 of world size 2 did not join"),
              std::string::npos)
        << e.what();
  }
}

TEST(NcclOneRank, RefusesHostMemory) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  std::vector<std::uint8_t> host(4096);
  // NCCL moves device memory only: a HOST registration is refused.
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_RECEIVER;
  ferry_transport_t* t = nullptr;
  ErrorPtr e(api->create(&args, &t));
  ASSERT_FALSE(e) << error_message(e.get());
  ferry_memory_desc_t desc{};
  desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
  desc.base = host.data();
  desc.size = host.size();
  desc.kind = FERRY_MEMORY_HOST;
  ferry_memory_t* memory = nullptr;
  e.reset(api->register_memory(t, &desc, &memory));
  ASSERT_TRUE(e);
  EXPECT_EQ(error_code(e.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error_message(e.get()).find("not CUDA device memory"), std::string::npos);
  api->destroy(t);
}

}  // namespace
}  // namespace ferry::nccl

// main() is the GPU tests' shared one (tests/common/gpu_test_main.cpp: exit 77 without a CUDA
// device). NCCL reads NCCL_NVLS_ENABLE when a communicator is created, so setting it here, before
// any test runs, holds for a run outside meson too.
std::optional<int> ferry::test::before_gpu_tests(int /*argc*/, char** /*argv*/) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  return std::nullopt;
}
