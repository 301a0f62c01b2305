// Tests of the update engine's transactions: full updates commit exact bytes; an update killed or
// failing half way never advances the version, is rolled back exactly under the backup policy
// and fences the receiver under the discard policy until a full update commits; the host
// mirror's refresh after a commit (in the background or at commit) is what a failure right after
// the commit rolls back to, and a refresh that failed fences the next failed update.
#include "update_fixture.hpp"

#include "store/cpu_weight_store.hpp"
#include "store/host_mirror.hpp"
#include "update/update_engine.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

namespace ferry::update {
namespace {

using namespace ferry::update::testing;
using testing::Bucket;  // the test's, not update::Bucket (update/bucket_source.hpp)
using store::CpuWeightStore;
using store::Policy;

using Weights = std::map<std::string, std::vector<std::byte>>;

std::vector<LayoutParam> small_layout() {
  return {{"embed", FERRY_DTYPE_BF16, {64, 48}},
          {"layers.0.w", FERRY_DTYPE_F32, {33, 17}},
          {"layers.1.w", FERRY_DTYPE_F32, {40}},
          {"norm", FERRY_DTYPE_F16, {48}}};
}

const std::vector<std::vector<std::string>> kBucketNames = {{"embed", "layers.0.w"},
                                                            {"layers.1.w"},
                                                            {"norm"}};

// The same names as small_layout() (the same buckets), with 20 MiB of weights: a mirror refresh
// of them still copies when the next call comes right after the commit.
std::vector<LayoutParam> large_layout() {
  return {{"embed", FERRY_DTYPE_BF16, {4096, 2048}},
          {"layers.0.w", FERRY_DTYPE_F32, {1024, 1024}},
          {"layers.1.w", FERRY_DTYPE_F32, {40}},
          {"norm", FERRY_DTYPE_F16, {48}}};
}

// The fixture's default: the next update waits for the mirror's copy (mirror_refresh =
// "complete"), so the rollback tests roll back whatever the pace; the pre-emption of the default
// ("background") has its own tests, which pass UpdateOptions{}.
UpdateOptions rollback_always() {
  UpdateOptions options;
  options.mirror_refresh = MirrorRefreshMode::complete;
  return options;
}

// A receiver: store with the layout placed under "weights", a plan provider and the engine.
struct Receiver {
  explicit Receiver(Policy policy, UpdateOptions options = rollback_always(),
                    std::vector<LayoutParam> layout = small_layout())
      : plans(std::move(layout)) {
    std::vector<store::TensorSpec> specs;
    for (const auto& p : plans.layout()) specs.push_back({p.name, p.dtype, p.shape});
    store.place_all("weights", policy, specs);
    engine = std::make_unique<UpdateEngine>(store, plans, options);
  }

  Bucket bucket(const Weights& w, std::uint64_t version, std::uint32_t k) const {
    return make_bucket(plans.layout(), w, kBucketNames[k], version, k,
                       static_cast<std::uint32_t>(kBucketNames.size()));
  }

  void apply(const Bucket& b) { engine->apply_bucket(b.bytes, b.encoded()); }

  void push(const Weights& w, std::uint64_t version) {
    engine->begin(version, "v" + std::to_string(version));
    for (std::uint32_t k = 0; k < kBucketNames.size(); ++k) apply(bucket(w, version, k));
    engine->commit();
  }

  // The buckets of `w` as update `version`, built ahead (so that applying them starts at once).
  std::vector<Bucket> buckets(const Weights& w, std::uint64_t version) const {
    std::vector<Bucket> out;
    for (std::uint32_t k = 0; k < kBucketNames.size(); ++k) out.push_back(bucket(w, version, k));
    return out;
  }
  void push(const std::vector<Bucket>& buckets, std::uint64_t version) {
    engine->begin(version, "v" + std::to_string(version));
    for (const auto& b : buckets) apply(b);
    engine->commit();
  }

  // What the mirror's slot of `name` holds.
  std::vector<std::byte> mirror_slot(const std::string& name) const {
    const auto mirror = store.mirror();
    const auto entry = mirror->find(name).value();
    const std::byte* data = mirror->slot(entry);
    return {data, data + mirror->entries()[entry].bytes};
  }

  Weights contents() const {
    Weights out;
    for (const auto& p : plans.layout()) {
      const auto info = store.param(p.name);
      std::vector<std::byte> bytes(info.bytes);
      store.read(*store.find(p.name), 0, bytes);
      out[p.name] = std::move(bytes);
    }
    return out;
  }

  CpuWeightStore store;
  IdentityPlans plans;
  std::unique_ptr<UpdateEngine> engine;
};

TEST(UpdateEngine, FullUpdateCommitsExactDataAndPublishesTheVersion) {
  Receiver r(Policy::Discard);
  EXPECT_FALSE(r.engine->health().ready);
  EXPECT_EQ(r.engine->health().reason, "no weights committed yet");
  const auto w = random_weights(r.plans.layout(), 1);
  r.push(w, 7);
  EXPECT_EQ(r.contents(), w);
  const auto v = r.engine->version();
  EXPECT_TRUE(v.committed);
  EXPECT_EQ(v.number, 7u);
  EXPECT_EQ(v.label, "v7");
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  const auto fps = r.engine->fingerprints();
  ASSERT_EQ(fps.size(), 4u);
  EXPECT_EQ(fps.at("norm"), kernels::fingerprint_cpu(w.at("norm").data(), w.at("norm").size()));
  const auto m = r.engine->metrics();
  EXPECT_EQ(m.updates_committed, 1u);
  EXPECT_EQ(m.updates_aborted, 0u);
  EXPECT_EQ(m.buckets_applied, 3u);
  EXPECT_GT(m.bytes_applied, 64u * 48u * 2u);
  EXPECT_FALSE(r.engine->active());
  // A staged update's commit fingerprints every parameter from the weights: it reads them all.
  std::uint64_t weight_bytes = 0;
  for (const auto& [name, bytes] : w) weight_bytes += bytes.size();
  EXPECT_EQ(m.commit_fingerprint_read_bytes, weight_bytes);
}

// Each entry of `b` copied into memory of its own, `skew` bytes past a 256-byte boundary (the
// sender's tensors, lent to a receiver that reads them in place), and the engine's bucket that
// names where they lie (update::Bucket::entry_data) instead of carrying bytes.
struct LentBucket {
  std::vector<std::vector<std::byte>> storage;
  update::Bucket bucket;
};
LentBucket lend(const Bucket& b, std::size_t skew) {
  LentBucket out;
  out.bucket.manifest_bytes = b.encoded();
  for (const auto& e : b.manifest.tensors) {
    auto& memory = out.storage.emplace_back(e.size + 256 + skew);
    auto at = reinterpret_cast<std::uintptr_t>(memory.data());
    auto* first = memory.data() + ((256 - at % 256) % 256) + skew;
    std::copy_n(b.bytes.data() + e.offset, e.size, first);
    out.bucket.entry_data.push_back(first);
  }
  return out;
}

// Reads in place ([one-pass]): a bucket whose entries lie wherever the sender's tensors are is
// verified and applied from there, with the plan cached for their places; the bytes applied are
// the entries' own. An entry whose bytes are not the manifest's fails before anything of its
// bucket is written.
TEST(UpdateEngine, ABucketReadInPlaceIsAppliedFromWhereItsEntriesLie) {
  Receiver r(Policy::Backup);
  const auto w = random_weights(r.plans.layout(), 1);
  r.push(w, 1);
  const auto next = random_weights(r.plans.layout(), 2);
  for (std::uint64_t version = 2; version <= 3; ++version) {
    const auto before = r.engine->metrics();
    r.engine->begin(version, "read");
    std::uint64_t entry_bytes = 0;
    for (std::uint32_t k = 0; k < kBucketNames.size(); ++k) {
      const Bucket b = r.bucket(next, version, k);
      for (const auto& e : b.manifest.tensors) entry_bytes += e.size;
      auto lent = lend(b, 16 * k + 2 * version);
      r.engine->apply(lent.bucket);
    }
    r.engine->commit();
    EXPECT_EQ(r.contents(), next);
    const auto m = r.engine->metrics();
    EXPECT_EQ(m.bytes_applied - before.bytes_applied, entry_bytes);
  }
  const auto third = random_weights(r.plans.layout(), 3);
  r.engine->begin(4, "corrupt");
  auto lent = lend(r.bucket(third, 4, 0), 0);
  const auto written = r.contents();
  std::memset(lent.storage[1].data() + 300, 0x5a, 8);  // a word of 'layers.0.w' changed
  const auto e = error_of([&] { r.engine->apply(lent.bucket); });
  EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
  EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << e.what();
  EXPECT_EQ(r.contents(), written);
  EXPECT_EQ(r.engine->version().number, 3u);
}

// /metrics' histograms: each committed update is one observation of its seconds and of the bytes
// it applied; an aborted one is none.
TEST(UpdateEngine, HistogramsObserveEachCommittedUpdateOnly) {
  Receiver r(Policy::Discard);
  const auto w = random_weights(r.plans.layout(), 1);
  r.push(w, 1);
  const auto one = r.engine->metrics();
  EXPECT_EQ(one.update_seconds.count(), 1u);
  EXPECT_EQ(one.update_bytes.count(), 1u);
  EXPECT_EQ(one.update_bytes.sum(), static_cast<double>(one.bytes_applied));
  EXPECT_GT(one.update_seconds.sum(), 0);
  r.engine->begin(2, "v2");
  r.apply(r.bucket(w, 2, 0));
  r.engine->abort("stopped by the test");
  r.push(w, 3);
  const auto m = r.engine->metrics();
  EXPECT_EQ(m.updates_aborted, 1u);
  EXPECT_EQ(m.update_seconds.count(), 2u);
  EXPECT_EQ(m.update_bytes.count(), 2u);
  // The aborted update's bucket counts in bytes_applied, not in the histogram.
  EXPECT_EQ(m.update_bytes.sum(), 2 * one.update_bytes.sum());
  EXPECT_GT(static_cast<double>(m.bytes_applied), m.update_bytes.sum());
}

TEST(UpdateEngine, CallsOutOfOrderAreRefused) {
  Receiver r(Policy::Discard);
  const auto w = random_weights(r.plans.layout(), 2);
  const auto b = r.bucket(w, 1, 0);
  EXPECT_EQ(error_of([&] { r.apply(b); }).code(), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(error_of([&] { r.engine->commit(); }).code(), FERRY_STATUS_FAILED_PRECONDITION);
  r.engine->begin(1, "a");
  const auto e = error_of([&] { r.engine->begin(2, "b"); });
  EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(std::string(e.what()).find("update 1"), std::string::npos) << e.what();
  // The refused begin did not disturb the active update.
  for (std::uint32_t k = 0; k < 3; ++k) r.apply(r.bucket(w, 1, k));
  r.engine->commit();
  EXPECT_EQ(r.engine->version().number, 1u);
}

// Direct delivery needs device parameters: host ones get no destination, and the calls that
// record in-place writes are refused outside an update that declared them.
TEST(UpdateEngine, HostParametersOfferNoDirectDestinationAndInPlaceCallsNeedAnUpdate) {
  Receiver r(Policy::Discard);
  const auto descs = descs_of(r.plans.layout());
  const auto dests = r.engine->direct_destinations(descs);
  ASSERT_EQ(dests.size(), descs.size());
  for (const auto& d : dests) EXPECT_FALSE(d.has_value());
  EXPECT_EQ(error_of([&] { r.engine->begin_direct_writes(); }).code(),
            FERRY_STATUS_FAILED_PRECONDITION);
  const auto w = random_weights(r.plans.layout(), 3);
  r.engine->begin(1, "v1");
  const auto e =
      error_of([&] { r.engine->record_direct_bucket(r.bucket(w, 1, 0).encoded()); });
  EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  // The refusal did not end the update: it still commits.
  for (std::uint32_t k = 0; k < 3; ++k) r.apply(r.bucket(w, 1, k));
  r.engine->commit();
  EXPECT_EQ(r.contents(), w);
}

TEST(UpdateEngine, CommitWithMissingParamsListsThemAndAborts) {
  Receiver r(Policy::Discard);
  const auto w = random_weights(r.plans.layout(), 3);
  r.engine->begin(4, "v4");
  r.apply(r.bucket(w, 4, 0));
  const auto e = error_of([&] { r.engine->commit(); });
  EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  const std::string msg = e.what();
  EXPECT_NE(msg.find("2 of 4 parameters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layers.1.w"), std::string::npos) << msg;
  EXPECT_NE(msg.find("norm"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("embed"), std::string::npos) << msg;
  EXPECT_FALSE(r.engine->active());
  EXPECT_FALSE(r.engine->version().committed);
  EXPECT_EQ(r.engine->metrics().updates_aborted, 1u);
  const auto h = r.engine->health();
  EXPECT_FALSE(h.ready);
  EXPECT_NE(h.reason.find("update 4 aborted at commit"), std::string::npos) << h.reason;
}

TEST(UpdateEngine, AbortHalfwayWithBackupRestoresOldBytesExactly) {
  Receiver r(Policy::Backup);
  const auto old_weights = random_weights(r.plans.layout(), 10);
  r.push(old_weights, 1);
  const auto next = random_weights(r.plans.layout(), 11);
  r.engine->begin(2, "v2");
  r.apply(r.bucket(next, 2, 0));
  r.apply(r.bucket(next, 2, 1));
  EXPECT_FALSE(r.engine->health().ready);  // live weights are mixed while the update runs
  EXPECT_NE(r.contents(), old_weights);
  r.engine->abort("trainer killed");
  EXPECT_EQ(r.contents(), old_weights);
  EXPECT_EQ(r.engine->version().number, 1u);
  EXPECT_EQ(r.engine->version().label, "v1");
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->metrics().rollbacks, 1u);
  EXPECT_FALSE(r.engine->metrics().fenced);
}

TEST(UpdateEngine, FingerprintMismatchIsRefusedBeforeWritingAndRolledBack) {
  Receiver r(Policy::Backup);
  const auto old_weights = random_weights(r.plans.layout(), 20);
  r.push(old_weights, 5);
  const auto next = random_weights(r.plans.layout(), 21);
  r.engine->begin(6, "v6");
  r.apply(r.bucket(next, 6, 0));
  auto corrupt = r.bucket(next, 6, 1);
  corrupt.bytes[corrupt.manifest.tensors[0].offset + 3] ^= std::byte{0x40};  // flipped in flight
  const auto e = error_of([&] { r.apply(corrupt); });
  EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(std::string(e.what()).find("layers.1.w"), std::string::npos) << e.what();
  EXPECT_FALSE(r.engine->active());
  EXPECT_EQ(r.contents(), old_weights);
  EXPECT_EQ(r.engine->version().number, 5u);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  // Later buckets of the dead update are refused.
  EXPECT_EQ(error_of([&] { r.apply(r.bucket(next, 6, 2)); }).code(),
            FERRY_STATUS_FAILED_PRECONDITION);
}

TEST(UpdateEngine, FingerprintMismatchWritesNothingOfThatBucket) {
  Receiver r(Policy::Discard);
  const auto old_weights = random_weights(r.plans.layout(), 25);
  r.push(old_weights, 1);
  const auto next = random_weights(r.plans.layout(), 26);
  r.engine->begin(2, "v2");
  auto corrupt = r.bucket(next, 2, 0);
  corrupt.bytes.back() ^= std::byte{1};  // the last byte of layers.0.w
  EXPECT_EQ(error_of([&] { r.apply(corrupt); }).code(), FERRY_STATUS_CORRUPT_DATA);
  // embed, earlier in the same bucket, was not written either; nothing was dirty, so no fence.
  EXPECT_EQ(r.contents(), old_weights);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->version().number, 1u);
}

TEST(UpdateEngine, LyingManifestWithDiscardFencesUntilAFullUpdate) {
  Receiver r(Policy::Discard);
  r.push(random_weights(r.plans.layout(), 30), 1);
  const auto next = random_weights(r.plans.layout(), 31);
  r.engine->begin(2, "v2");
  r.apply(r.bucket(next, 2, 0));
  auto lying = r.bucket(next, 2, 1);
  lying.manifest.bucket_bytes += 64;  // claims more bytes than arrived
  const auto e = error_of([&] { r.apply(lying); });
  EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_EQ(r.engine->version().number, 1u);
  const auto h = r.engine->health();
  EXPECT_FALSE(h.ready);
  EXPECT_NE(h.reason.find("update 2 aborted at bucket 1"), std::string::npos) << h.reason;
  EXPECT_NE(h.reason.find("weights are partial until a full update or disk reload succeeds"),
            std::string::npos)
      << h.reason;
  EXPECT_TRUE(r.engine->metrics().fenced);
  EXPECT_FALSE(r.store.contents_valid("weights"));

  // A partial update does not lift the fence...
  const auto third = random_weights(r.plans.layout(), 32);
  r.engine->begin(3, "v3");
  r.apply(r.bucket(third, 3, 0));
  r.engine->abort("operator cancelled");
  EXPECT_FALSE(r.engine->health().ready);
  EXPECT_NE(r.engine->health().reason.find("update 3 aborted after bucket 0"), std::string::npos)
      << r.engine->health().reason;
  // ...a full one does.
  r.push(third, 4);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->version().number, 4u);
  EXPECT_EQ(r.contents(), third);
  EXPECT_TRUE(r.store.contents_valid("weights"));
  EXPECT_FALSE(r.engine->metrics().fenced);
}

TEST(UpdateEngine, BucketOfAnotherUpdateOrCatalogIsRefused) {
  Receiver r(Policy::Backup);
  const auto w = random_weights(r.plans.layout(), 40);
  r.push(w, 1);
  const auto next = random_weights(r.plans.layout(), 41);
  r.engine->begin(2, "v2");
  r.apply(r.bucket(next, 2, 0));
  const auto stale = r.bucket(next, 9, 1);
  EXPECT_EQ(error_of([&] { r.apply(stale); }).code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_EQ(r.contents(), w);
  r.engine->begin(3, "v3");
  const std::vector<std::uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto b = r.bucket(next, 3, 0);
  EXPECT_EQ(error_of([&] { r.engine->apply_bucket(b.bytes, garbage); }).code(),
            FERRY_STATUS_CORRUPT_DATA);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
}

TEST(UpdateEngine, ExpectedFingerprintMismatchAtCommitAbortsNamingTheParameter) {
  Receiver r(Policy::Backup);
  const auto w = random_weights(r.plans.layout(), 50);
  r.push(w, 1);
  const auto next = random_weights(r.plans.layout(), 51);
  r.engine->begin(2, "v2");
  for (std::uint32_t k = 0; k < 3; ++k) r.apply(r.bucket(next, 2, k));
  std::map<std::string, std::uint64_t> expected;
  for (const auto& [name, bytes] : next) {
    expected[name] = kernels::fingerprint_cpu(bytes.data(), bytes.size());
  }
  expected["layers.0.w"] ^= 1;
  r.engine->set_expected_fingerprints(expected);
  const auto e = error_of([&] { r.engine->commit(); });
  EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << e.what();
  EXPECT_EQ(r.contents(), w);
  EXPECT_EQ(r.engine->version().number, 1u);

  // With the right fingerprints the same update commits.
  expected["layers.0.w"] ^= 1;
  r.engine->begin(3, "v3");
  for (std::uint32_t k = 0; k < 3; ++k) r.apply(r.bucket(next, 3, k));
  r.engine->set_expected_fingerprints(expected);
  r.engine->commit();
  EXPECT_EQ(r.contents(), next);
  EXPECT_EQ(r.engine->version().number, 3u);
}

TEST(UpdateEngine, PlanIsComputedOncePerBucketShape) {
  Receiver r(Policy::Discard);
  r.push(random_weights(r.plans.layout(), 60), 1);
  r.push(random_weights(r.plans.layout(), 61), 2);
  r.push(random_weights(r.plans.layout(), 62), 3);
  EXPECT_EQ(r.plans.calls, 3);
  EXPECT_EQ(r.engine->metrics().plan_cache_misses, 3u);
  EXPECT_EQ(r.engine->metrics().plan_cache_hits, 6u);
}

TEST(UpdateEngine, ReleasedWeightsRefuseAnUpdateAndCannotBeReleasedDuringOne) {
  Receiver r(Policy::Backup);
  const auto w = random_weights(r.plans.layout(), 70);
  r.push(w, 1);
  const std::vector<std::string> tags = {"weights"};
  r.engine->begin(2, "v2");
  EXPECT_EQ(error_of([&] { r.store.release(tags); }).code(), FERRY_STATUS_FAILED_PRECONDITION);
  r.engine->abort("test");
  r.store.release(tags);
  EXPECT_FALSE(r.engine->health().ready);
  EXPECT_NE(r.engine->health().reason.find("released"), std::string::npos);
  const auto e = error_of([&] { r.engine->begin(3, "v3"); });
  EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(std::string(e.what()).find("released"), std::string::npos) << e.what();
  r.store.resume(tags);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.contents(), w);
}

TEST(UpdateEngine, DiscardReleaseMakesTheReceiverUnreadyUntilAFullUpdate) {
  Receiver r(Policy::Discard);
  r.push(random_weights(r.plans.layout(), 80), 1);
  const std::vector<std::string> tags = {"weights"};
  r.store.release(tags);
  r.store.resume(tags);
  EXPECT_FALSE(r.engine->health().ready);
  EXPECT_NE(r.engine->health().reason.find("discard"), std::string::npos);
  const auto w = random_weights(r.plans.layout(), 81);
  r.push(w, 2);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.contents(), w);
}

TEST(UpdateEngine, LayoutParameterMissingFromTheStoreIsNamedAtBegin) {
  CpuWeightStore store;
  store.place_all("weights", Policy::Discard,
                  std::vector<store::TensorSpec>{{"embed", FERRY_DTYPE_BF16, {64, 48}}});
  IdentityPlans plans(small_layout());
  UpdateEngine engine(store, plans);
  const auto e = error_of([&] { engine.begin(1, "v1"); });
  EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
  EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << e.what();
  EXPECT_FALSE(engine.active());
}

TEST(UpdateEngine, RestartRestoresTheCommittedVersionFromAFileMirror) {
  const auto dir = std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                             : std::filesystem::temp_directory_path();
  const auto path = dir / ("ferry-update-test-" + std::to_string(::getpid()));
  Weights committed;
  {
    Receiver r(Policy::Backup);
    r.store.attach_mirror(store::HostMirror::create_file(path, r.store.mirror_layout()));
    committed = random_weights(r.plans.layout(), 90);
    r.push(committed, 12);
    // A failed later update must not disturb what the mirror holds.
    r.engine->begin(13, "v13");
    r.apply(r.bucket(random_weights(r.plans.layout(), 91), 13, 0));
    r.engine->abort("trainer gone");
  }
  Receiver restarted(Policy::Backup);
  const auto layout = restarted.store.mirror_layout();
  restarted.store.attach_mirror(store::HostMirror::open_file(path, &layout));
  restarted.engine->restore_from_mirror();
  std::filesystem::remove(path);
  EXPECT_EQ(restarted.contents(), committed);
  EXPECT_EQ(restarted.engine->version().number, 12u);
  EXPECT_EQ(restarted.engine->version().label, "v12");
  EXPECT_TRUE(restarted.engine->health().ready) << restarted.engine->health().reason;
}

// Versions only increase: a repeated or older number is refused before anything is written (the
// weights and the published version stay); the number of an update that never committed may be
// used again.
TEST(UpdateEngine, AVersionNotAboveThePublishedOneIsRefused) {
  Receiver r(Policy::Backup);
  const auto w50 = random_weights(r.plans.layout(), 110);
  r.push(w50, 50);
  for (std::uint64_t stale : {50u, 10u, 0u}) {
    const Error e = error_of([&] { r.engine->begin(stale, "stale"); });
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find(fmt::format(
                  "update version {} is not newer than the published version 50 ('v50')", stale)),
              std::string::npos)
        << e.what();
    EXPECT_FALSE(r.engine->active());
    EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  }
  EXPECT_EQ(r.contents(), w50);
  EXPECT_EQ(r.engine->version().number, 50u);
  r.engine->begin(51, "v51");
  r.apply(r.bucket(random_weights(r.plans.layout(), 111), 51, 0));
  r.engine->abort("trainer gone");
  const auto w51 = random_weights(r.plans.layout(), 112);
  r.push(w51, 51);  // 51 never committed: usable again
  EXPECT_EQ(r.engine->version().number, 51u);
  EXPECT_EQ(r.contents(), w51);
}

TEST(UpdateEngine, RestoreWithoutACommittedMirrorIsRefused) {
  Receiver r(Policy::Backup);
  EXPECT_EQ(error_of([&] { r.engine->restore_from_mirror(); }).code(),
            FERRY_STATUS_FAILED_PRECONDITION);
  Receiver d(Policy::Discard);
  d.push(random_weights(d.plans.layout(), 95), 1);
  EXPECT_EQ(error_of([&] { d.engine->restore_from_mirror(); }).code(),
            FERRY_STATUS_FAILED_PRECONDITION);
}

TEST(UpdateEngine, AdoptCurrentPublishesEngineLoadedWeights) {
  Receiver r(Policy::Backup);
  const auto w = random_weights(r.plans.layout(), 100);
  for (const auto& [name, bytes] : w) r.store.write(*r.store.find(name), 0, bytes);
  r.engine->adopt_current(3, "loaded-by-engine");
  EXPECT_TRUE(r.engine->health().ready);
  r.engine->set_version_label("relabelled");
  EXPECT_EQ(r.engine->version().label, "relabelled");
  EXPECT_EQ(r.store.mirror()->committed()->label, "relabelled");
  // The adopted weights are the rollback point.
  r.engine->begin(4, "v4");
  r.apply(r.bucket(random_weights(r.plans.layout(), 101), 4, 0));
  r.engine->abort("test");
  EXPECT_EQ(r.contents(), w);
  EXPECT_EQ(r.engine->version().number, 3u);
}

TEST(UpdateEngine, VersionAndHealthAreReadableFromAnotherThreadDuringUpdates) {
  Receiver r(Policy::Backup);
  std::atomic<bool> done{false};
  std::vector<std::uint64_t> seen;
  std::thread reader([&] {
    while (!done.load()) {
      const auto v = r.engine->version();
      const auto h = r.engine->health();
      if (v.committed && (seen.empty() || seen.back() != v.number)) seen.push_back(v.number);
      (void)h;
    }
  });
  std::set<std::uint64_t> committed;
  for (std::uint64_t version = 1; version <= 20; ++version) {
    const auto w = random_weights(r.plans.layout(), 200 + version);
    if (version % 3 == 0) {
      r.engine->begin(version, "aborted");
      r.apply(r.bucket(w, version, 0));
      r.engine->abort("every third update is abandoned");
    } else {
      r.push(w, version);
      committed.insert(version);
    }
  }
  done = true;
  reader.join();
  // Only committed versions were ever visible, in increasing order.
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(committed.count(seen[i]), 1u) << seen[i];
    if (i > 0) {
      EXPECT_LT(seen[i - 1], seen[i]);
    }
  }
  EXPECT_EQ(r.engine->version().number, 20u);
  EXPECT_EQ(r.engine->metrics().updates_aborted, 6u);
  EXPECT_EQ(r.engine->metrics().updates_committed, 14u);
}

// ---- the host mirror's refresh (memory.mirror_refresh) ------------------------------------

UpdateOptions refresh_at_commit() {
  UpdateOptions options;
  options.mirror_refresh = MirrorRefreshMode::commit;
  return options;
}

UpdateOptions refresh_complete() {
  UpdateOptions options;
  options.mirror_refresh = MirrorRefreshMode::complete;
  return options;
}

// With mirror_refresh = "complete", commit returns while the mirror still copies; the next
// update's begin waits for it, so an update that fails right after a commit rolls back to
// exactly the bytes of the version just published (not the one before, not a mix).
TEST(UpdateEngineMirrorRefresh, AFailureRightAfterACompleteRefreshRollsBackToThePublishedBytes) {
  Receiver r(Policy::Backup, refresh_complete(), large_layout());
  const auto& layout = r.plans.layout();
  const auto w1 = random_weights(layout, 300);
  const auto w2 = random_weights(layout, 301);
  const auto w3 = random_weights(layout, 302);
  const auto w4 = random_weights(layout, 303);
  const auto w5 = random_weights(layout, 304);
  const auto b1 = r.buckets(w1, 1);
  const auto b2 = r.buckets(w2, 2);
  auto b3 = r.buckets(w3, 3);
  b3[1].bytes[b3[1].manifest.tensors[0].offset] ^= std::byte{0x10};  // refused after bucket 0
  const auto b4 = r.buckets(w4, 4);
  const auto b5 = r.buckets(w5, 5);

  r.push(b1, 1);
  r.push(b2, 2);
  r.engine->begin(3, "v3");  // right after the commit of version 2
  r.apply(b3[0]);            // embed and layers.0.w of version 3 in the live weights
  EXPECT_EQ(error_of([&] { r.apply(b3[1]); }).code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_TRUE(r.contents() == w2) << "the rollback did not restore exactly version 2";
  EXPECT_EQ(r.engine->version().number, 2u);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->metrics().rollbacks, 1u);

  // Again, with an abort right after the commit.
  r.push(b4, 4);
  r.engine->begin(5, "v5");
  r.apply(b5[0]);
  r.engine->abort("trainer killed");
  EXPECT_TRUE(r.contents() == w4) << "the rollback did not restore exactly version 4";
  EXPECT_EQ(r.engine->version().number, 4u);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->metrics().rollbacks, 2u);
  const auto state = r.store.wait_for_mirror_refresh();
  EXPECT_FALSE(state.failed) << state.error;
  EXPECT_EQ(state.version, 4u);
  EXPECT_EQ(state.finished, 3u);  // versions 1, 2 and 4
  ASSERT_TRUE(r.store.mirror()->committed().has_value());
  EXPECT_EQ(r.store.mirror()->committed()->number, 4u);
  EXPECT_EQ(r.store.mirror()->committed()->label, "v4");
  EXPECT_GT(r.engine->metrics().mirror_refresh_seconds, 0.0);
}

// With the default ("background"), an update that begins while the mirror still copies the
// previous version pre-empts that copy: its own failure then fences, naming the pre-emption,
// instead of rolling back. Whichever happened (the copy may have ended first), the receiver never
// serves a mix: either it rolled back to exactly the published bytes, or it is fenced with the
// reason; and a later full update makes it ready again with a complete mirror.
TEST(UpdateEngineMirrorRefresh, AnUpdateDuringABackgroundRefreshPreemptsItAndNeverServesAMix) {
  // 64 MiB of weights: the copy takes milliseconds here, and an update that begins right after
  // the commit finds it running.
  std::vector<LayoutParam> layout_64mib = large_layout();
  layout_64mib[0].shape = {8192, 4096};
  Receiver r(Policy::Backup, {}, layout_64mib);
  constexpr int kRounds = 3;
  const auto& layout = r.plans.layout();
  int preempted = 0;
  int rolled_back = 0;
  std::uint64_t version = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto w_ok = random_weights(layout, 400 + round);
    const auto w_bad = random_weights(layout, 500 + round);
    const auto ok = r.buckets(w_ok, version + 1);
    auto bad = r.buckets(w_bad, version + 2);
    bad[1].bytes[bad[1].manifest.tensors[0].offset] ^= std::byte{0x10};
    ++version;
    r.push(ok, version);
    ++version;
    r.engine->begin(version, "bad");  // right after the commit: the refresh may still copy
    r.apply(bad[0]);
    EXPECT_EQ(error_of([&] { r.apply(bad[1]); }).code(), FERRY_STATUS_CORRUPT_DATA);
    const auto health = r.engine->health();
    if (health.ready) {
      ++rolled_back;
      EXPECT_TRUE(r.contents() == w_ok) << "a rollback to something other than the published bytes";
    } else {
      ++preempted;
      EXPECT_NE(health.reason.find("pre-empted: update"), std::string::npos) << health.reason;
      EXPECT_NE(health.reason.find("began before the host mirror finished copying version"),
                std::string::npos)
          << health.reason;
    }
    EXPECT_EQ(r.engine->version().number, version - 1);
    --version;  // the failed number is reused by the next round's full update
  }
  // A full update after all that: ready, and its mirror refresh (left to finish) is complete.
  const auto w_last = random_weights(layout, 600);
  ++version;
  r.push(r.buckets(w_last, version), version);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  const auto state = r.store.wait_for_mirror_refresh();
  EXPECT_FALSE(state.failed) << state.error;
  ASSERT_TRUE(r.store.mirror()->committed().has_value());
  EXPECT_EQ(r.store.mirror()->committed()->number, version);
  EXPECT_EQ(preempted + rolled_back, kRounds);
  std::printf("%d updates right after a commit: %d pre-empted the refresh, %d rolled back\n",
              kRounds, preempted, rolled_back);
}

// A release with policy backup right after a commit (the refresh may still copy) and the resume
// after it give back exactly the committed bytes; the mirror still holds that version for a
// rollback.
TEST(UpdateEngineMirrorRefresh, ReleaseRightAfterACommitResumesExactlyTheCommittedBytes) {
  Receiver r(Policy::Backup, {}, large_layout());
  const auto& layout = r.plans.layout();
  const auto w1 = random_weights(layout, 310);
  const auto w2 = random_weights(layout, 311);
  const auto b1 = r.buckets(w1, 1);
  const auto b2 = r.buckets(w2, 2);
  const auto b3 = r.buckets(random_weights(layout, 312), 3);
  const std::vector<std::string> tags = {"weights"};
  r.push(b1, 1);
  r.push(b2, 2);
  r.store.release(tags);
  EXPECT_FALSE(r.engine->health().ready);
  r.store.resume(tags);
  EXPECT_TRUE(r.contents() == w2) << "resume did not restore exactly version 2";
  EXPECT_EQ(r.engine->version().number, 2u);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  r.engine->begin(3, "v3");
  r.apply(b3[0]);
  r.engine->abort("test");
  EXPECT_TRUE(r.contents() == w2);
  EXPECT_EQ(r.engine->metrics().rollbacks, 1u);
}

// mirror_refresh = "commit": the mirror holds the version, every byte of it, when commit
// returns, with nothing waited for.
TEST(UpdateEngineMirrorRefresh, RefreshAtCommitHoldsTheVersionWhenCommitReturns) {
  Receiver r(Policy::Backup, refresh_at_commit(), large_layout());
  const auto& layout = r.plans.layout();
  const auto w1 = random_weights(layout, 320);
  r.push(w1, 1);
  const auto state = r.store.mirror_refresh_state();  // no wait
  EXPECT_FALSE(state.running);
  EXPECT_FALSE(state.failed) << state.error;
  EXPECT_EQ(state.finished, 1u);
  EXPECT_EQ(state.version, 1u);
  EXPECT_EQ(r.engine->metrics().mirror_version, 1u);
  ASSERT_TRUE(r.store.mirror()->committed().has_value());
  EXPECT_EQ(r.store.mirror()->committed()->number, 1u);
  for (const auto& [name, bytes] : w1) {
    EXPECT_TRUE(r.mirror_slot(name) == bytes) << name;
    const auto entry = *r.store.mirror()->find(name);
    EXPECT_EQ(r.store.mirror()->fingerprint(entry), r.engine->fingerprints().at(name)) << name;
  }
  r.engine->begin(2, "v2");
  r.apply(r.bucket(random_weights(layout, 321), 2, 0));
  r.engine->abort("test");
  EXPECT_TRUE(r.contents() == w1);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->metrics().mirror_refresh_waits, 0u);
  EXPECT_GT(r.engine->metrics().mirror_refresh_seconds, 0.0);
}

// A refresh that fails leaves the version published and served but without a rollback copy: the
// next update that fails after writing live weights fences, saying why, and never restores the
// older version the mirror held before (that would serve a mix). A full update lifts the fence
// and the mirror holds that update's version again.
class UpdateEngineRefreshFailure : public ::testing::TestWithParam<MirrorRefreshMode> {};

TEST_P(UpdateEngineRefreshFailure, AFailedRefreshFencesTheNextFailedUpdateWithTheReason) {
  UpdateOptions options;
  options.mirror_refresh = GetParam();
  Receiver r(Policy::Backup, options);
  const auto& layout = r.plans.layout();
  const auto w1 = random_weights(layout, 330);
  const auto w2 = random_weights(layout, 331);
  const auto w3 = random_weights(layout, 332);
  const auto w4 = random_weights(layout, 333);
  r.push(w1, 1);
  r.store.fail_next_mirror_refresh("cudaMemcpyAsync: an illegal memory access was encountered");
  r.push(w2, 2);
  EXPECT_EQ(r.engine->version().number, 2u);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_TRUE(r.contents() == w2);
  r.store.wait_for_mirror_refresh();
  EXPECT_EQ(r.engine->metrics().mirror_version, 0u) << "the failed refresh holds no version";

  r.engine->begin(3, "v3");
  r.apply(r.bucket(w3, 3, 0));  // embed and layers.0.w
  r.engine->abort("trainer killed");
  const auto h = r.engine->health();
  EXPECT_FALSE(h.ready);
  EXPECT_NE(h.reason.find("update 3 aborted after bucket 0: trainer killed"), std::string::npos)
      << h.reason;
  EXPECT_NE(h.reason.find("the host mirror did not hold the published version 2: its refresh "
                          "failed: cudaMemcpyAsync: an illegal memory access was encountered"),
            std::string::npos)
      << h.reason;
  EXPECT_NE(h.reason.find("weights are partial until a full update"), std::string::npos)
      << h.reason;
  EXPECT_TRUE(r.engine->metrics().fenced);
  EXPECT_EQ(r.engine->metrics().rollbacks, 0u);
  EXPECT_EQ(r.engine->version().number, 2u);
  EXPECT_FALSE(r.store.contents_valid("weights"));
  // Nothing was rolled back to version 1: the weights are version 3's where it wrote, version
  // 2's elsewhere, and say so (fenced) instead of serving them.
  const auto now = r.contents();
  EXPECT_TRUE(now.at("embed") == w3.at("embed"));
  EXPECT_TRUE(now.at("layers.1.w") == w2.at("layers.1.w"));
  EXPECT_FALSE(r.store.mirror()->committed().has_value());
  const auto e = error_of([&] { r.engine->restore_from_mirror(); });
  EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(std::string(e.what()).find("refresh with version 2 failed"), std::string::npos)
      << e.what();

  // A full update lifts the fence; its refresh succeeds and is the next rollback point.
  r.push(w4, 4);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  // At an RL step's pace the copy has landed before the next update (in the background mode an
  // update that comes sooner pre-empts it: AnUpdateDuringABackgroundRefreshPreemptsIt...).
  (void)r.store.wait_for_mirror_refresh();
  r.engine->begin(5, "v5");
  r.apply(r.bucket(w1, 5, 0));
  r.engine->abort("test");
  EXPECT_TRUE(r.contents() == w4);
  EXPECT_TRUE(r.engine->health().ready) << r.engine->health().reason;
  EXPECT_EQ(r.engine->metrics().rollbacks, 1u);
}

INSTANTIATE_TEST_SUITE_P(BothModes, UpdateEngineRefreshFailure,
                         ::testing::Values(MirrorRefreshMode::background,
                                           MirrorRefreshMode::commit),
                         [](const auto& info) {
                           return info.param == MirrorRefreshMode::background ? "Background"
                                                                              : "AtCommit";
                         });

}  // namespace
}  // namespace ferry::update
