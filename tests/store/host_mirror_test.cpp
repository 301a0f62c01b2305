// Tests of the host mirror: parallel copies, the file-backed format reopened by a second instance
// (restart without the trainer, also after a shutdown during a background refresh), refusal of
// mismatched, corrupt, damaged or in-use files, and what a file that claims no version says about
// why (a process killed during a refresh, a pre-empted refresh, a release of invalid weights).
#include "store/cpu_weight_store.hpp"
#include "store/host_mirror.hpp"
#include "store/tagged_region_store.hpp"

#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

namespace ferry::store {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// A file under /dev/shm (or the temp folder) removed at the end of the test.
class MirrorFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path shm = "/dev/shm";
    const auto dir = std::filesystem::is_directory(shm) ? shm : std::filesystem::temp_directory_path();
    path_ = dir / ("ferry-mirror-test-" + std::to_string(::getpid()) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

const std::vector<std::string> kWeights = {"weights"};

std::vector<TensorSpec> model_specs() {
  return {{"embed", FERRY_DTYPE_BF16, {512, 96}},
          {"layers.0.w", FERRY_DTYPE_F32, {33, 17}},
          {"norm", FERRY_DTYPE_F32, {96}}};
}

std::vector<std::vector<std::byte>> fill_random(WeightStore& store, std::uint32_t seed) {
  std::vector<std::vector<std::byte>> out;
  for (std::size_t i = 0; i < store.param_count(); ++i) {
    auto bytes = random_bytes(store.param(i).bytes, seed + static_cast<std::uint32_t>(i));
    store.write(i, 0, bytes);
    out.push_back(std::move(bytes));
  }
  return out;
}

TEST(CopyParallel, CopiesManyChunksExactly) {
  const auto src = random_bytes(40ull << 20, 3);
  std::vector<std::byte> dst(src.size());
  const auto small = random_bytes(777, 4);
  std::vector<std::byte> small_dst(small.size());
  const std::vector<CopyJob> jobs = {{dst.data(), src.data(), src.size()},
                                     {small_dst.data(), small.data(), small.size()}};
  copy_parallel(jobs, 4);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(small_dst, small);
}

TEST_F(MirrorFile, ReopenedByASecondInstanceRestoresContents) {
  std::vector<std::vector<std::byte>> saved;
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, model_specs());
    saved = fill_random(store, 40);
    auto mirror = HostMirror::create_file(path_, store.mirror_layout());
    EXPECT_EQ(mirror->committed(), std::nullopt);
    store.attach_mirror(std::move(mirror));
    store.save_to_mirror(kWeights);
    store.mirror()->set_committed({17, "step-17"}, std::vector<std::uint64_t>{1, 2, 3});
  }
  // A fresh store (as after a restart) with the same layout, filled with other bytes.
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  fill_random(store, 90);
  const auto layout = store.mirror_layout();
  std::shared_ptr<HostMirror> mirror = HostMirror::open_file(path_, &layout);
  ASSERT_TRUE(mirror->committed().has_value());
  EXPECT_EQ(mirror->committed()->number, 17u);
  EXPECT_EQ(mirror->committed()->label, "step-17");
  EXPECT_EQ(mirror->fingerprint(2), 3u);
  EXPECT_TRUE(mirror->filled(0));
  store.attach_mirror(mirror);
  store.restore_from_mirror(kWeights);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    std::vector<std::byte> now(saved[i].size());
    store.read(i, 0, now);
    EXPECT_EQ(now, saved[i]) << store.param(i).name;
  }
}

// A store destroyed while its background refresh still copies (a receiver shutting down right
// after a commit) joins the copy: the file then holds every byte of that version and says so.
TEST_F(MirrorFile, AStoreDestroyedDuringABackgroundRefreshLeavesTheFileHoldingThatVersion) {
  auto specs = model_specs();
  specs.push_back({"big", FERRY_DTYPE_U8, {48ull << 20}});
  std::vector<std::vector<std::byte>> saved;
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, specs);
    saved = fill_random(store, 60);
    store.attach_mirror(HostMirror::create_file(path_, store.mirror_layout()));
    const std::vector<std::size_t> params = {0, 1, 2, 3};
    const std::vector<std::uint64_t> prints = {5, 6, 7, 8};
    store.refresh_mirror(kWeights, {21, "step-21"}, params, prints, true);
  }
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, specs);
  const auto layout = store.mirror_layout();
  std::shared_ptr<HostMirror> mirror = HostMirror::open_file(path_, &layout);
  ASSERT_TRUE(mirror->committed().has_value());
  EXPECT_EQ(*mirror->committed(), (CommittedVersion{21, "step-21"}));
  EXPECT_EQ(mirror->fingerprint(3), 8u);
  store.attach_mirror(mirror);
  store.restore_from_mirror(kWeights);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    std::vector<std::byte> now(saved[i].size());
    store.read(i, 0, now);
    EXPECT_TRUE(now == saved[i]) << store.param(i).name;
  }
}

TEST_F(MirrorFile, RefusesAMismatchedLayoutNamingTheParameter) {
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, model_specs());
    HostMirror::create_file(path_, store.mirror_layout());
  }
  auto specs = model_specs();
  specs[1].shape = {33, 18};
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, specs);
  const auto layout = store.mirror_layout();
  try {
    HostMirror::open_file(path_, &layout);
    FAIL() << "a mismatched layout was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << e.what();
  }
  // Opening without an expected layout works; attaching it to this store does not.
  std::shared_ptr<HostMirror> mirror = HostMirror::open_file(path_);
  EXPECT_EQ(mirror->entries().size(), 3u);
  try {
    store.attach_mirror(mirror);
    FAIL() << "attach_mirror accepted a mismatched mirror";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
  }
  mirror.reset();  // a mirror file is held by one mirror at a time (its lock)
  // One parameter fewer is a mismatch too.
  specs.pop_back();
  specs[1].shape = {33, 17};
  CpuWeightStore shorter;
  shorter.place_all("weights", Policy::Backup, specs);
  const auto short_layout = shorter.mirror_layout();
  try {
    HostMirror::open_file(path_, &short_layout);
    FAIL() << "a shorter layout was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("norm"), std::string::npos) << e.what();
  }
}

TEST_F(MirrorFile, RefusesCorruptOrTruncatedFiles) {
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, model_specs());
    HostMirror::create_file(path_, store.mirror_layout());
  }
  const auto size = std::filesystem::file_size(path_);
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(128 + 256 + 3 * 16 + 2));
    f.put('X');  // inside the parameter table, which is checksummed
  }
  try {
    HostMirror::open_file(path_);
    FAIL() << "a corrupt table was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(path_, size - 4096);
  try {
    HostMirror::open_file(path_);
    FAIL() << "a truncated file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
  }
  {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f << "definitely not a mirror file, but long enough to hold a whole header of 128 bytes ...."
         "..................................................";
  }
  try {
    HostMirror::open_file(path_);
    FAIL() << "a foreign file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path_);
  try {
    HostMirror::open_file(path_);
    FAIL() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
  }
}

TEST_F(MirrorFile, ClearedCommitMarksNoVersionAfterReopen) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  auto mirror = HostMirror::create_file(path_, store.mirror_layout());
  mirror->set_committed({3, "x"}, std::vector<std::uint64_t>(3, 0));
  mirror->clear_committed();
  mirror.reset();
  auto reopened = HostMirror::open_file(path_);
  EXPECT_EQ(reopened->committed(), std::nullopt);
  EXPECT_FALSE(reopened->filled(0));
  std::vector<std::byte> target(reopened->entries()[0].bytes);
  const std::size_t entry[] = {0};
  std::byte* const targets[] = {target.data()};
  try {
    reopened->restore(entry, targets);
    FAIL() << "restore of an empty slot succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find("embed"), std::string::npos) << e.what();
  }
}

TEST(HostMirror, AnonymousMirrorBacksUpOnlyBackupTags) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  store.place_all("kv_cache", Policy::Discard,
                  std::vector<TensorSpec>{{"kv", FERRY_DTYPE_F32, {1024}}});
  const auto layout = store.mirror_layout();
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_EQ(layout[0].name, "embed");
  EXPECT_EQ(layout[2].tag, "weights");
}

// ---- restart without the trainer: what a reopened file claims, and why it claims nothing ----

// A store whose one big parameter takes a background refresh many batches (tens of ms) to copy.
std::vector<TensorSpec> big_specs() {
  auto specs = model_specs();
  specs.push_back({"big", FERRY_DTYPE_U8, {5 * TaggedRegionStore::kRefreshBatchBytes}});
  return specs;
}

const std::vector<std::size_t> kBigParams = {0, 1, 2, 3};
const std::vector<std::uint64_t> kBigPrints = {11, 12, 13, 14};

// The offset of the committed version number in the 128-byte header (magic 8, format 4,
// has_committed 4, five u64 sizes and hashes).
constexpr std::streamoff kCommittedVersionOffset = 8 + 4 + 4 + 5 * 8;

void flip_byte(const std::filesystem::path& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x01));
}

std::string open_error(const std::filesystem::path& path, ferry_status_code_t want) {
  try {
    HostMirror::open_file(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "open_file accepted " << path;
  return {};
}

TEST_F(MirrorFile, AProcessKilledDuringABackgroundRefreshLeavesAFileThatClaimsNothingAndSaysWhy) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The receiver: version 6 in the mirror, then version 7's copy starts in the background and
    // the process dies at once (no destructor joins the copy).
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, big_specs());
    store.attach_mirror(HostMirror::create_file(path_, store.mirror_layout()));
    store.refresh_mirror(kWeights, {6, "v6"}, kBigParams, kBigPrints, false);
    store.refresh_mirror(kWeights, {7, "v7"}, kBigParams, kBigPrints, true);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto mirror = HostMirror::open_file(path_);
  EXPECT_EQ(mirror->committed(), std::nullopt);
  const auto why = mirror->uncommitted_reason();
  EXPECT_NE(why.find("the copy of version 7 into the mirror began and did not end"),
            std::string::npos)
      << why;
  EXPECT_FALSE(mirror->filled(3));
}

TEST_F(MirrorFile, APreemptedRefreshLeavesAFileThatClaimsNothingAndSaysWhy) {
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, big_specs());
    store.attach_mirror(HostMirror::create_file(path_, store.mirror_layout()));
    store.refresh_mirror(kWeights, {8, "v8"}, kBigParams, kBigPrints, false);
    ASSERT_EQ(store.mirror()->committed(), (CommittedVersion{8, "v8"}));
    store.refresh_mirror(kWeights, {9, "v9"}, kBigParams, kBigPrints, true);
    store.preempt_mirror_refresh("update 10 began before the host mirror finished copying");
    const auto state = store.wait_for_mirror_refresh();
    ASSERT_TRUE(state.failed) << "the copy ended before it was pre-empted";
  }
  auto mirror = HostMirror::open_file(path_);
  // Neither version 8 (its slots were being overwritten) nor 9 (not all there).
  EXPECT_EQ(mirror->committed(), std::nullopt);
  const auto why = mirror->uncommitted_reason();
  EXPECT_NE(why.find("the copy of version 9 into the mirror did not end: pre-empted: update 10"),
            std::string::npos)
      << why;
}

TEST_F(MirrorFile, AReleaseOfInvalidWeightsLeavesAFileThatClaimsNothingAndSaysWhy) {
  {
    CpuWeightStore store;
    store.place_all("weights", Policy::Backup, model_specs());
    fill_random(store, 7);
    store.attach_mirror(HostMirror::create_file(path_, store.mirror_layout()));
    store.refresh_mirror(kWeights, {4, "v4"}, std::vector<std::size_t>{0, 1, 2},
                         std::vector<std::uint64_t>{1, 2, 3}, false);
    store.set_contents_valid("weights", false, "update 5 failed half way");
    store.release(kWeights);
  }
  auto mirror = HostMirror::open_file(path_);
  EXPECT_EQ(mirror->committed(), std::nullopt);
  EXPECT_NE(mirror->uncommitted_reason().find("update 5 failed half way"), std::string::npos)
      << mirror->uncommitted_reason();
}

TEST_F(MirrorFile, ADamagedCommittedRecordIsRefused) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  fill_random(store, 8);
  auto write_committed = [&] {
    auto mirror = HostMirror::create_file(path_, store.mirror_layout());
    mirror->set_committed({9, "v9"}, std::vector<std::uint64_t>{1, 2, 3});
  };
  // The version number: a restart would claim version 8 or 11 for version 9's bytes.
  write_committed();
  flip_byte(path_, kCommittedVersionOffset);
  auto why = open_error(path_, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(why.find(path_.string()), std::string::npos) << why;
  EXPECT_NE(why.find("record of committed version 8 is damaged"), std::string::npos) << why;
  // A fingerprint in the per-parameter state.
  write_committed();
  flip_byte(path_, 128 + 256 + 16 + 3);
  why = open_error(path_, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(why.find("record of committed version 9 is damaged"), std::string::npos) << why;
  // The label.
  write_committed();
  flip_byte(path_, 128 + 1);
  why = open_error(path_, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(why.find("damaged"), std::string::npos) << why;
  // The format version (a file of another ferry release).
  write_committed();
  flip_byte(path_, 8);
  why = open_error(path_, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(why.find("format version 2 is not the supported 3"), std::string::npos) << why;
  // Undamaged, the same file opens and claims version 9.
  write_committed();
  EXPECT_EQ(HostMirror::open_file(path_)->committed(), (CommittedVersion{9, "v9"}));
}

// A process killed during a release's backup copy leaves slots not marked filled under a version
// that stays committed: the file opens, and a restore refuses, naming the parameter.
TEST_F(MirrorFile, ASlotNotFilledUnderACommittedVersionIsRefusedByRestore) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  fill_random(store, 9);
  {
    auto mirror = HostMirror::create_file(path_, store.mirror_layout());
    const std::size_t entries[] = {0, 1, 2};
    std::vector<const std::byte*> sources;
    for (std::size_t i = 0; i < 3; ++i) sources.push_back(store.param(i).data);
    mirror->save(entries, sources);
    mirror->set_committed({5, "v5"}, std::vector<std::uint64_t>{1, 2, 3});
    mirror->clear_filled(1);
  }
  std::shared_ptr<HostMirror> mirror = HostMirror::open_file(path_);
  EXPECT_EQ(mirror->committed(), (CommittedVersion{5, "v5"}));
  store.attach_mirror(mirror);
  try {
    store.restore_from_mirror(kWeights);
    FAIL() << "a slot without a copy was restored";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << e.what();
  }
}

TEST_F(MirrorFile, AMirrorInUseCannotBeOpenedOrReplaced) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  auto mirror = HostMirror::create_file(path_, store.mirror_layout());
  auto why = open_error(path_, FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(why.find("in use by another running process"), std::string::npos) << why;
  try {
    HostMirror::create_file(path_, store.mirror_layout());
    FAIL() << "a mirror in use was replaced";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION) << e.what();
  }
  mirror.reset();
  EXPECT_NO_THROW(HostMirror::open_file(path_));
}

TEST_F(MirrorFile, MetadataAndTheCommitTimeSurviveAReopen) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Backup, model_specs());
  const std::string metadata = "{\"catalog\": []} and any bytes \x01\x02";
  const auto before = std::chrono::system_clock::now();
  {
    auto mirror = HostMirror::create_file(path_, store.mirror_layout(), 0, metadata);
    EXPECT_EQ(mirror->uncommitted_reason(), "it was created and has held no committed version yet");
    mirror->set_committed({2, "v2"}, std::vector<std::uint64_t>(3, 0));
  }
  const auto after = std::chrono::system_clock::now();
  auto mirror = HostMirror::open_file(path_);
  EXPECT_EQ(mirror->metadata(), metadata);
  EXPECT_GE(mirror->committed_at(), before);
  EXPECT_LE(mirror->committed_at(), after);
  EXPECT_EQ(mirror->uncommitted_reason(), "");
  mirror.reset();
  // The metadata is covered by the table's checksum.
  std::ifstream in(path_, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = bytes.find("any bytes");
  ASSERT_NE(at, std::string::npos);
  flip_byte(path_, static_cast<std::streamoff>(at));
  const auto why = open_error(path_, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(why.find("checksum mismatch"), std::string::npos) << why;
}

}  // namespace
}  // namespace ferry::store
