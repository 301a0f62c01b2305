// Tests of the CPU weight store: placement, stable addresses, release/resume by tag (resident
// memory, backup, discard), engine-owned parameters (their release saves and marks, frees
// nothing), wrong-state errors, and the host mirror's refresh (in the background: what waits for
// it, what it records, how it fails).
#include "store/cpu_weight_store.hpp"
#include "store/host_mirror.hpp"

#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace ferry::store {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// Resident set size of this process, in bytes (second field of /proc/self/statm, in pages).
std::uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0;
  std::uint64_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

std::vector<std::byte> read_all(const WeightStore& store, std::size_t index) {
  std::vector<std::byte> out(store.param(index).bytes);
  store.read(index, 0, out);
  return out;
}

template <typename Body>
ferry_status_code_t code_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.code();
  }
  return FERRY_STATUS_OK;
}

template <typename Body>
std::string message_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

const std::vector<std::string> kWeights = {"weights"};

TEST(CpuWeightStore, PlacesParametersAlignedInsideTheRegion) {
  CpuWeightStore store;
  const std::vector<TensorSpec> specs = {
      {"a", FERRY_DTYPE_F32, {3, 5}}, {"b", FERRY_DTYPE_BF16, {7}}, {"c", FERRY_DTYPE_U8, {1}}};
  EXPECT_EQ(region_bytes_for(specs), 256u + 256u + 1u);
  store.place_all("weights", Policy::Discard, specs);
  ASSERT_EQ(store.param_count(), 3u);
  const auto a = store.param("a");
  const auto b = store.param("b");
  const auto c = store.param("c");
  EXPECT_EQ(a.bytes, 60u);
  EXPECT_EQ(a.elements, 15u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data) % kParamAlignment, 0u);
  EXPECT_EQ(b.data - a.data, 256);
  EXPECT_EQ(c.data - b.data, 256);
  EXPECT_EQ(c.tag, "weights");
  EXPECT_FALSE(c.external);
  EXPECT_EQ(store.find("b"), std::optional<std::size_t>(1));
  EXPECT_EQ(store.find("zzz"), std::nullopt);
}

TEST(CpuWeightStore, RefusesDuplicateNamesBadShapesAndFullRegions) {
  CpuWeightStore store;
  store.create_region("weights", 4096, Policy::Discard);
  const std::uint64_t small[] = {16};
  store.place("weights", "a", FERRY_DTYPE_F32, small);
  EXPECT_EQ(code_of([&] { store.place("weights", "a", FERRY_DTYPE_F32, small); }),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(code_of([&] { store.place("weights", "bad", FERRY_DTYPE_INVALID, small); }),
            FERRY_STATUS_INVALID_ARGUMENT);
  const std::uint64_t huge[] = {1ull << 40, 1ull << 40};
  EXPECT_EQ(code_of([&] { store.place("weights", "huge", FERRY_DTYPE_F32, huge); }),
            FERRY_STATUS_INVALID_ARGUMENT);
  const std::uint64_t big[] = {4096};
  const auto msg = message_of([&] { store.place("weights", "big", FERRY_DTYPE_F32, big); });
  EXPECT_NE(msg.find("'big'"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { store.place("nope", "x", FERRY_DTYPE_F32, small); }),
            FERRY_STATUS_NOT_FOUND);
  EXPECT_EQ(store.param_count(), 1u);
}

TEST(CpuWeightStore, ReleaseDropsResidentMemoryAndResumeBringsItBack) {
  constexpr std::uint64_t kBytes = 64 * kMiB;
  CpuWeightStore store;
  store.create_region("kv_cache", kBytes, Policy::Discard);
  const std::uint64_t shape[] = {kBytes};
  const auto index = store.place("kv_cache", "blocks", FERRY_DTYPE_U8, shape);
  std::byte* data = store.param(index).data;
  std::memset(data, 0x5a, kBytes);
  const std::uint64_t touched = resident_bytes();

  store.release(std::vector<std::string>{"kv_cache"});
  const std::uint64_t released = resident_bytes();
  EXPECT_LT(released + kBytes * 9 / 10, touched)
      << "resident " << touched << " -> " << released << " after releasing " << kBytes;

  store.resume(std::vector<std::string>{"kv_cache"});
  EXPECT_EQ(store.param(index).data, data);
  std::memset(data, 0x11, kBytes);
  const std::uint64_t resumed = resident_bytes();
  EXPECT_GT(resumed, released + kBytes * 9 / 10)
      << "resident " << released << " -> " << resumed << " after resume and touch";
  EXPECT_EQ(data[kBytes - 1], std::byte{0x11});
}

TEST(CpuWeightStore, ReleaseKeepsVirtualAddress) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {1024}}});
  store.place_all("staging", Policy::Discard, std::vector<TensorSpec>{{"s", FERRY_DTYPE_U8, {4096}}});
  const auto w = store.param("w").data;
  const auto s = store.param("s").data;
  const std::vector<std::string> both = {"weights", "staging"};
  store.release(both);
  EXPECT_TRUE(store.released("weights"));
  EXPECT_TRUE(store.released("staging"));
  store.resume(both);
  EXPECT_EQ(store.param("w").data, w);
  EXPECT_EQ(store.param("s").data, s);
  EXPECT_FALSE(store.released("weights"));
}

TEST(CpuWeightStore, BackupPolicyRestoresExactContents) {
  CpuWeightStore store;
  const std::vector<TensorSpec> specs = {{"big", FERRY_DTYPE_BF16, {3, 1 << 20}},
                                         {"odd", FERRY_DTYPE_F32, {13, 7}},
                                         {"tiny", FERRY_DTYPE_U8, {3}}};
  store.place_all("weights", Policy::Backup, specs);
  std::vector<std::vector<std::byte>> before;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto bytes = random_bytes(store.param(i).bytes, 100 + static_cast<std::uint32_t>(i));
    store.write(i, 0, bytes);
    before.push_back(std::move(bytes));
  }
  store.release(kWeights);
  EXPECT_TRUE(store.contents_valid("weights"));
  store.resume(kWeights);
  EXPECT_TRUE(store.contents_valid("weights"));
  EXPECT_EQ(store.invalid_reason("weights"), "");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(read_all(store, i), before[i]) << specs[i].name;
  }
  // A second cycle works the same (the mirror is reused).
  store.release(kWeights);
  store.resume(kWeights);
  EXPECT_EQ(read_all(store, 0), before[0]);
}

TEST(CpuWeightStore, DiscardPolicyReportsContentsInvalidUntilRewritten) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Discard, std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {256}}});
  store.write(0, 0, random_bytes(1024, 7));
  store.release(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));
  EXPECT_NE(store.invalid_reason("weights").find("discard"), std::string::npos);
  store.resume(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));
  EXPECT_EQ(read_all(store, 0), std::vector<std::byte>(1024, std::byte{0}));

  const auto states = store.memory_state();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].tag, "weights");
  EXPECT_EQ(states[0].policy, Policy::Discard);
  EXPECT_FALSE(states[0].contents_valid);
  EXPECT_FALSE(states[0].released);
  EXPECT_EQ(states[0].bytes, static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_FALSE(states[0].reason.empty());

  store.set_contents_valid("weights", true, {});
  EXPECT_TRUE(store.contents_valid("weights"));
}

TEST(CpuWeightStore, WrongStateCallsAreRefusedWithoutCrashing) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Discard, std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {16}}});
  store.place_all("staging", Policy::Discard, std::vector<TensorSpec>{{"s", FERRY_DTYPE_F32, {16}}});
  EXPECT_EQ(code_of([&] { store.resume(kWeights); }), FERRY_STATUS_FAILED_PRECONDITION);
  store.release(kWeights);
  EXPECT_EQ(code_of([&] { store.release(kWeights); }), FERRY_STATUS_FAILED_PRECONDITION);
  std::vector<std::byte> buf(8);
  EXPECT_EQ(code_of([&] { store.write(0, 0, buf); }), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(code_of([&] { store.read(0, 0, buf); }), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(code_of([&] { store.released("kv_cache"); }), FERRY_STATUS_NOT_FOUND);
  // Validation comes before any action: an unknown tag in the list releases nothing.
  const std::vector<std::string> mixed = {"staging", "kv_cache"};
  EXPECT_EQ(code_of([&] { store.release(mixed); }), FERRY_STATUS_NOT_FOUND);
  EXPECT_FALSE(store.released("staging"));
  // Out-of-bounds access through the store API.
  store.resume(kWeights);
  EXPECT_EQ(code_of([&] { store.write(0, 60, buf); }), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(code_of([&] { store.read(9, 0, buf); }), FERRY_STATUS_NOT_FOUND);
}

TEST(CpuWeightStoreDeathTest, RawAccessToAReleasedRegionFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CpuWeightStore store;
  store.place_all("weights", Policy::Discard, std::vector<TensorSpec>{{"w", FERRY_DTYPE_U8, {64}}});
  volatile std::byte* data = store.param(0).data;
  store.release(kWeights);
  EXPECT_DEATH({ data[0] = std::byte{1}; }, "");
}

TEST(CpuWeightStore, ExternalParamsAreNeverReallocatedAndTheirReleaseOnlySavesAndMarks) {
  std::vector<float> engine_tensor(64, 1.5f);
  CpuWeightStore store;
  const std::uint64_t shape[] = {8, 8};
  const auto index = store.register_external("weights", "lm_head", FERRY_DTYPE_F32, shape,
                                             engine_tensor.data(), FERRY_MEMORY_HOST);
  store.place_all("staging", Policy::Discard,
                  std::vector<TensorSpec>{{"bucket", FERRY_DTYPE_U8, {1 << 20}}});
  const auto info = store.param(index);
  EXPECT_TRUE(info.external);
  EXPECT_EQ(info.data, reinterpret_cast<std::byte*>(engine_tensor.data()));
  EXPECT_EQ(info.bytes, 256u);

  // The engine's release: its memory is not freed or touched; with backup it is saved, and the
  // engine's new memory (same address) gets it back at the resume. With discard it is invalid.
  store.set_policy("weights", Policy::Backup);
  store.release(kWeights);
  EXPECT_TRUE(store.released("weights"));
  EXPECT_EQ(engine_tensor[3], 1.5f);
  std::fill(engine_tensor.begin(), engine_tensor.end(), 0.0f);  // the allocator's new pages
  store.resume(kWeights);
  EXPECT_FALSE(store.released("weights"));
  EXPECT_EQ(engine_tensor[3], 1.5f);
  EXPECT_TRUE(store.contents_valid("weights"));
  store.set_policy("weights", Policy::Discard);
  store.release(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));
  store.resume(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));

  const float value = 2.25f;
  store.write(index, 4 * sizeof(float), std::as_bytes(std::span(&value, 1)));
  EXPECT_EQ(engine_tensor[4], 2.25f);
  EXPECT_EQ(store.param(index).data, reinterpret_cast<std::byte*>(engine_tensor.data()));
  EXPECT_EQ(code_of([&] {
              store.register_external("weights", "gpu", FERRY_DTYPE_F32, shape,
                                      engine_tensor.data(), FERRY_MEMORY_CUDA);
            }),
            FERRY_STATUS_INVALID_ARGUMENT);
}

TEST(CpuWeightStore, ReleaseIsRefusedWhileAWriterHoldsTheTag) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {16}}});
  store.begin_writes(kWeights, "update 3");
  const auto msg = message_of([&] { store.release(kWeights); });
  EXPECT_NE(msg.find("update 3"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { store.begin_writes(kWeights, "update 4"); }),
            FERRY_STATUS_FAILED_PRECONDITION);
  store.end_writes(kWeights);
  store.release(kWeights);
  EXPECT_EQ(code_of([&] { store.begin_writes(kWeights, "update 5"); }),
            FERRY_STATUS_FAILED_PRECONDITION);
}

TEST(CpuWeightStore, SaveAndRestoreThroughTheMirrorRollBackWrites) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {1000}}});
  const auto original = random_bytes(4000, 11);
  store.write(0, 0, original);
  store.save_to_mirror(kWeights);
  store.write(0, 0, random_bytes(4000, 12));
  store.restore_from_mirror(kWeights);
  EXPECT_EQ(read_all(store, 0), original);
  ASSERT_NE(store.mirror(), nullptr);
  EXPECT_FALSE(store.mirror()->file_backed());

  store.place_all("kv_cache", Policy::Discard,
                  std::vector<TensorSpec>{{"kv", FERRY_DTYPE_F32, {16}}});
  const std::vector<std::string> kv = {"kv_cache"};
  EXPECT_EQ(code_of([&] { store.save_to_mirror(kv); }), FERRY_STATUS_FAILED_PRECONDITION);
}

// ---- the mirror refresh (refresh_mirror: a committed version into the mirror) -------------

// Two parameters, the first large enough (32 MiB) that its copy is still running when the next
// call comes, filled with `old_bytes` / `small`.
struct RefreshFixture {
  RefreshFixture() {
    store.place_all("weights", Policy::Backup,
                    std::vector<TensorSpec>{{"big", FERRY_DTYPE_U8, {32 * kMiB}},
                                            {"small", FERRY_DTYPE_F32, {1000}}});
    store.write(0, 0, big);
    store.write(1, 0, small);
  }
  // Refreshes the mirror as version `number` (fingerprints 11 and 22).
  void refresh(std::uint64_t number, bool background) {
    const std::vector<std::size_t> params = {0, 1};
    const std::vector<std::uint64_t> prints = {11, 22};
    store.refresh_mirror(kWeights, {number, "v" + std::to_string(number)}, params, prints,
                         background);
  }
  std::vector<std::byte> slot(const std::string& name) {
    const auto mirror = store.mirror();
    const auto entry = mirror->find(name).value();
    const std::byte* data = mirror->slot(entry);
    return {data, data + mirror->entries()[entry].bytes};
  }

  CpuWeightStore store;
  std::vector<std::byte> big = random_bytes(32 * kMiB, 31);
  std::vector<std::byte> small = random_bytes(4000, 32);
};

TEST(CpuWeightStoreRefresh, BackgroundRefreshRecordsTheVersionWithEveryByteAndWritesWaitForIt) {
  RefreshFixture f;
  const auto newer = random_bytes(32 * kMiB, 33);
  f.refresh(7, true);
  // The write must not overtake the copy: it waits for the refresh, so the mirror holds the
  // bytes of version 7 and never a mix.
  f.store.write(0, 0, newer);
  const auto state = f.store.wait_for_mirror_refresh();
  EXPECT_FALSE(state.running);
  EXPECT_FALSE(state.failed) << state.error;
  EXPECT_EQ(state.version, 7u);
  EXPECT_EQ(state.finished, 1u);
  const auto mirror = f.store.mirror();
  ASSERT_NE(mirror, nullptr);
  ASSERT_TRUE(mirror->committed().has_value());
  EXPECT_EQ(*mirror->committed(), (CommittedVersion{7, "v7"}));
  EXPECT_EQ(mirror->fingerprint(*mirror->find("big")), 11u);
  EXPECT_EQ(mirror->fingerprint(*mirror->find("small")), 22u);
  EXPECT_TRUE(mirror->filled(*mirror->find("big")));
  EXPECT_TRUE(f.slot("big") == f.big);
  EXPECT_TRUE(f.slot("small") == f.small);
  EXPECT_TRUE(read_all(f.store, 0) == newer);
  f.store.restore_from_mirror(kWeights);
  EXPECT_TRUE(read_all(f.store, 0) == f.big);
  EXPECT_TRUE(read_all(f.store, 1) == f.small);
}

TEST(CpuWeightStoreRefresh, ReleaseRightAfterARefreshResumesTheExactBytes) {
  RefreshFixture f;
  f.refresh(3, true);
  f.store.release(kWeights);  // waits for the refresh, then backs the tag up itself
  EXPECT_FALSE(f.store.mirror_refresh_state().running);
  f.store.resume(kWeights);
  EXPECT_TRUE(read_all(f.store, 0) == f.big);
  EXPECT_TRUE(read_all(f.store, 1) == f.small);
  ASSERT_TRUE(f.store.mirror()->committed().has_value());
  EXPECT_EQ(f.store.mirror()->committed()->number, 3u);
}

TEST(CpuWeightStoreRefresh, RefreshOnTheCallingThreadHasEndedWhenItReturns) {
  RefreshFixture f;
  f.refresh(4, false);
  const auto state = f.store.mirror_refresh_state();  // no wait
  EXPECT_FALSE(state.running);
  EXPECT_EQ(state.finished, 1u);
  EXPECT_EQ(state.waits, 0u);
  EXPECT_GT(state.last_seconds, 0.0);
  ASSERT_TRUE(f.store.mirror()->committed().has_value());
  EXPECT_EQ(f.store.mirror()->committed()->number, 4u);
  EXPECT_TRUE(f.slot("big") == f.big);
}

TEST(CpuWeightStoreRefresh, AFailedRefreshLeavesTheMirrorWithoutACommittedVersion) {
  RefreshFixture f;
  f.refresh(1, true);
  ASSERT_FALSE(f.store.wait_for_mirror_refresh().failed);
  f.store.fail_next_mirror_refresh("the copy engine caught fire");
  f.refresh(2, true);
  const auto state = f.store.wait_for_mirror_refresh();
  EXPECT_TRUE(state.failed);
  EXPECT_EQ(state.version, 2u);
  EXPECT_NE(state.error.find("the copy engine caught fire"), std::string::npos) << state.error;
  // Neither version 1 (its slots were being overwritten) nor version 2 (not all there).
  const auto mirror = f.store.mirror();
  EXPECT_FALSE(mirror->committed().has_value());
  EXPECT_FALSE(mirror->filled(*mirror->find("big")));
  EXPECT_FALSE(mirror->filled(*mirror->find("small")));
  const auto msg = message_of([&] { f.store.restore_from_mirror(kWeights); });
  EXPECT_NE(msg.find("holds no copy"), std::string::npos) << msg;
  // A release backs the tag up itself: resume still gives the exact bytes back.
  f.store.release(kWeights);
  f.store.resume(kWeights);
  EXPECT_TRUE(read_all(f.store, 0) == f.big);
  // The next refresh that succeeds clears the failure.
  f.refresh(3, true);
  const auto after = f.store.wait_for_mirror_refresh();
  EXPECT_FALSE(after.failed) << after.error;
  EXPECT_EQ(after.finished, 3u);
  ASSERT_TRUE(mirror->committed().has_value());
  EXPECT_EQ(mirror->committed()->number, 3u);
}

TEST(CpuWeightStoreRefresh, ARefreshThatCannotStartThrowsAndIsRecorded) {
  RefreshFixture f;
  f.refresh(4, true);
  ASSERT_FALSE(f.store.wait_for_mirror_refresh().failed);
  f.store.place_all("kv_cache", Policy::Discard,
                    std::vector<TensorSpec>{{"kv", FERRY_DTYPE_F32, {16}}});
  const std::vector<std::string> kv = {"kv_cache"};
  const std::vector<std::size_t> params = {2};
  const std::vector<std::uint64_t> prints = {5};
  EXPECT_EQ(code_of([&] { f.store.refresh_mirror(kv, {5, "v5"}, params, prints, true); }),
            FERRY_STATUS_FAILED_PRECONDITION);
  auto state = f.store.mirror_refresh_state();
  EXPECT_TRUE(state.failed);
  EXPECT_EQ(state.version, 5u);
  EXPECT_NE(state.error.find("kv_cache"), std::string::npos) << state.error;
  const std::vector<std::uint64_t> two = {5, 6};
  EXPECT_EQ(code_of([&] { f.store.refresh_mirror(kWeights, {6, "v6"}, params, two, true); }),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_FALSE(f.store.mirror_refresh_state().running);
  // The mirror no longer claims version 4: the refresh that replaces it was started and failed.
  EXPECT_FALSE(f.store.mirror()->committed().has_value());
}

TEST(CpuWeightStoreRefresh, LayoutChangesWaitAndAStoreDestroyedDuringARefreshJoinsIt) {
  auto f = std::make_unique<RefreshFixture>();
  f->refresh(8, true);
  // A new Backup parameter replaces the mirror: only once the copy into it has ended.
  f->store.place_all("more", Policy::Backup,
                     std::vector<TensorSpec>{{"extra", FERRY_DTYPE_F32, {8}}});
  EXPECT_FALSE(f->store.mirror_refresh_state().running);
  EXPECT_EQ(f->store.mirror_refresh_state().finished, 1u);
  f->refresh(9, true);
  f.reset();  // must join the copy before the regions it reads are unmapped
}

}  // namespace
}  // namespace ferry::store
