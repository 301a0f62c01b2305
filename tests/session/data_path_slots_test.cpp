// tests/session/data_path_slots_test.cpp: where a plugin receiver's staging slots come from. With
// the UCX plugin (ABI 1.7 alloc_memory) they are shared memory the plugin allocated (a memory
// file), which a sender of this host maps: its data path then puts (a copy through the mapping)
// and the bucket lands byte-exact, with the plugin's default options as with shm and
// error_mode = none. With a plugin that allocates nothing (tests/plugins' loop transport) the
// host allocates them and buckets move as before.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/data_path.hpp"

namespace ferry::session {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// The /proc/self/maps line of the mapping that holds `p` ("" when none does).
std::string mapping_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> lo >> dash >> hi;
    if (address >= lo && address < hi) return line;
  }
  return "";
}

bool is_shared_memory(const std::string& mapping) {
  return mapping.find("SYSV") != std::string::npos ||
         mapping.find("/dev/shm/") != std::string::npos ||
         mapping.find("/memfd:") != std::string::npos;
}

// A registry of the plugin in environment variable `env` (skipped when unset: not built).
std::unique_ptr<registry::Registry> registry_of(const char* env) {
  const char* path = std::getenv(env);
  if (path == nullptr) return nullptr;
  return std::make_unique<registry::Registry>(
      std::vector<std::filesystem::path>{std::filesystem::path(path).parent_path()});
}

std::uint8_t pattern(std::uint64_t i) { return static_cast<std::uint8_t>((i * 131) ^ (i >> 9)); }

class UcxSlots : public ::testing::TestWithParam<bool> {};

TEST_P(UcxSlots, ReceiverSlotsAreSharedMemoryASenderPutsIntoByteExact) {
  auto registry = registry_of("FERRY_UCX_PLUGIN");
  if (!registry) GTEST_SKIP() << "the UCX plugin is not built";
  config::Config config;
  if (GetParam()) config.transports["ucx"] = {{"tls", "sm"}, {"error_mode", "none"}};
  constexpr std::uint64_t kCapacity = 8 * kMiB + 4096;
  auto receiver = make_plugin_receiver_path(*registry, config, "ucx", kCapacity, 2);
  for (std::uint32_t s = 0; s < 2; ++s) {
    const auto slot = receiver->slot(s);
    ASSERT_EQ(slot.size(), kCapacity);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(slot.data()) % FERRY_BUCKET_ALIGNMENT, 0u);
    EXPECT_TRUE(is_shared_memory(mapping_of(slot.data())))
        << "slot " << s << " lies in " << mapping_of(slot.data());
  }
  std::vector<std::vector<std::uint8_t>> keys = {receiver->slot_key(0), receiver->slot_key(1)};
  ASSERT_TRUE(receiver->rma_native());

  auto sender = make_plugin_sender_path(*registry, config, "ucx", kCapacity, 2);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  const auto receiver_address = receiver->address();
  const auto sender_address = sender->address();
  std::thread accept([&] { receiver->connect(sender_address, "sender", deadline); });
  sender->connect(receiver_address, keys, true, "receiver", deadline);
  accept.join();
  EXPECT_TRUE(sender->uses_put()) << "the sender should put into mapped slots under rma = auto";

  const std::uint64_t bytes = 8 * kMiB + 17;
  auto out = sender->slot(1);
  for (std::uint64_t i = 0; i < bytes; ++i) out[i] = std::byte{pattern(i)};
  std::memset(receiver->slot(1).data(), 0, kCapacity);
  sender->deliver(1, 0, bytes, deadline, "bucket 0");
  const auto in = receiver->slot(1);
  std::uint64_t first_bad = bytes;
  for (std::uint64_t i = 0; i < bytes && first_bad == bytes; ++i) {
    if (in[i] != std::byte{pattern(i)}) first_bad = i;
  }
  EXPECT_EQ(first_bad, bytes) << "the bucket differs from byte " << first_bad;
}

INSTANTIATE_TEST_SUITE_P(Options, UcxSlots, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "shm_error_mode_none" : "defaults");
                         });

TEST(PluginSlots, ATransportWithoutAllocGetsHostAllocatedSlots) {
  auto registry = registry_of("FERRY_LOOP_PLUGIN");
  if (!registry) GTEST_SKIP() << "FERRY_LOOP_PLUGIN is not set";
  const auto loop = registry->transport("loop");
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->transport()->alloc_memory, nullptr);
  config::Config config;
  auto receiver = make_plugin_receiver_path(*registry, config, "loop", kMiB, 2);
  for (std::uint32_t s = 0; s < 2; ++s) {
    const auto slot = receiver->slot(s);
    ASSERT_EQ(slot.size(), kMiB);
    EXPECT_FALSE(is_shared_memory(mapping_of(slot.data()))) << mapping_of(slot.data());
  }
  std::vector<std::vector<std::uint8_t>> keys = {receiver->slot_key(0), receiver->slot_key(1)};
  auto sender = make_plugin_sender_path(*registry, config, "loop", kMiB, 2);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  receiver->connect(sender->address(), "sender", deadline);
  sender->connect(receiver->address(), keys, receiver->rma_native(), "receiver", deadline);
  ASSERT_TRUE(sender->uses_put());
  auto out = sender->slot(0);
  for (std::uint64_t i = 0; i < kMiB; ++i) out[i] = std::byte{pattern(i)};
  sender->deliver(0, 0, kMiB, deadline, "bucket 0");
  const auto in = receiver->slot(0);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), kMiB), 0);
}

}  // namespace
}  // namespace ferry::session
