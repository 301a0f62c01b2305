// Tests of the update loop (update/update_loop.hpp): a double-buffered source's buckets are
// fetched into alternating slots and applied one at a time, the report counts what was applied,
// fingerprints a source computed are what the engine checks, and when an apply fails while the
// next bucket is being fetched, the apply's error is the one reported and the update aborts.
#include "update_fixture.hpp"

#include "store/cpu_weight_store.hpp"
#include "update/update_loop.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

namespace ferry::update {
namespace {

using store::CpuWeightStore;
using store::Policy;

const std::vector<std::vector<std::string>> kNames = {{"a", "b"}, {"c"}, {"d"}};

std::vector<LayoutParam> layout() {
  return {{"a", FERRY_DTYPE_F32, {64}},
          {"b", FERRY_DTYPE_BF16, {8, 8}},
          {"c", FERRY_DTYPE_F32, {100}},
          {"d", FERRY_DTYPE_F16, {16}}};
}

struct Engine {
  Engine() : plans(layout()) {
    std::vector<store::TensorSpec> specs;
    for (const auto& p : plans.layout()) specs.push_back({p.name, p.dtype, p.shape});
    store.place_all("weights", Policy::Discard, specs);
    engine = std::make_unique<UpdateEngine>(store, plans);
  }
  CpuWeightStore store;
  testing::IdentityPlans plans;
  std::unique_ptr<UpdateEngine> engine;
};

// Buckets of one update from memory; records what the loop asked and told.
class TestSource : public BucketSource {
 public:
  TestSource(std::vector<testing::Bucket> buckets, bool double_buffered)
      : buckets_(std::move(buckets)), double_buffered_(double_buffered) {}

  bool double_buffered() const override { return double_buffered_; }
  void begun() override { begun_ = true; }
  bool next(std::uint32_t slot, Bucket& out) override {
    if (next_ == buckets_.size()) return false;
    slots.push_back(slot);
    const auto& b = buckets_[next_++];
    out.data = b.bytes;
    out.manifest_bytes = b.encoded();
    out.entry_fingerprints = prints;
    return true;
  }
  void applied(const Bucket& b) override { applied_tensors += b.manifest->tensors.size(); }
  void apply_failed(const Error& e) noexcept override { failures.push_back(e.code()); }

  std::vector<std::uint32_t> slots;
  std::size_t applied_tensors = 0;
  std::vector<ferry_status_code_t> failures;
  std::vector<std::uint64_t> prints;  // given as the source's fingerprints of every bucket
  bool begun_ = false;

 protected:
  std::vector<testing::Bucket> buckets_;
  std::size_t next_ = 0;
  bool double_buffered_ = false;
};

std::vector<testing::Bucket> buckets_of(const std::map<std::string, std::vector<std::byte>>& w,
                                        std::uint64_t version) {
  std::vector<testing::Bucket> out;
  for (std::uint32_t k = 0; k < kNames.size(); ++k) {
    out.push_back(testing::make_bucket(layout(), w, kNames[k], version, k,
                                       static_cast<std::uint32_t>(kNames.size())));
  }
  return out;
}

TEST(UpdateLoop, DoubleBufferedSourceFillsAlternateSlotsAndReportsWhatWasApplied) {
  Engine e;
  const auto w = testing::random_weights(layout(), 3);
  TestSource source(buckets_of(w, 5), true);
  const auto report = run_update(*e.engine, source, {5, "five", std::nullopt, nullptr});
  EXPECT_TRUE(source.begun_);
  EXPECT_EQ(source.slots, (std::vector<std::uint32_t>{0, 1, 0}));
  EXPECT_EQ(source.applied_tensors, 4u);
  EXPECT_EQ(report.buckets, 3u);
  EXPECT_EQ(report.tensors, 4u);
  EXPECT_EQ(report.version.number, 5u);
  EXPECT_EQ(report.version.label, "five");
  EXPECT_EQ(e.engine->version().number, 5u);
  for (const auto& p : layout()) {
    std::vector<std::byte> bytes(w.at(p.name).size());
    e.store.read(*e.store.find(p.name), 0, bytes);
    EXPECT_EQ(bytes, w.at(p.name)) << p.name;
  }
}

TEST(UpdateLoop, FingerprintsTheSourceComputedAreWhatTheEngineChecks) {
  Engine e;
  const auto w = testing::random_weights(layout(), 4);
  TestSource source(buckets_of(w, 1), false);
  // The bytes are right, the source's fingerprints of them are not: the engine compares those
  // instead of reading the bytes again, so the update fails before anything is written.
  source.prints = {1, 2};
  const Error error = testing::error_of(
      [&] { run_update(*e.engine, source, {1, "one", std::nullopt, nullptr}); });
  EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA) << error.what();
  EXPECT_NE(std::string(error.what()).find("tensor 'a'"), std::string::npos) << error.what();
  EXPECT_FALSE(e.engine->version().committed);
  EXPECT_FALSE(e.engine->active());
  EXPECT_EQ(source.failures, (std::vector<ferry_status_code_t>{FERRY_STATUS_CORRUPT_DATA}));
}

// Bucket 1 is corrupt; the fetch of bucket 2 waits until the loop reports the apply's failure
// and then fails as a stopped connection would.
class StoppingSource final : public TestSource {
 public:
  using TestSource::TestSource;
  bool next(std::uint32_t slot, Bucket& out) override {
    if (next_ == 2) {
      std::unique_lock lock(mutex_);
      stopped_.wait(lock, [&] { return !failures.empty(); });
      fail(FERRY_STATUS_ABORTED, "the connection was shut down");
    }
    return TestSource::next(slot, out);
  }
  void apply_failed(const Error& e) noexcept override {
    {
      std::lock_guard lock(mutex_);
      TestSource::apply_failed(e);
    }
    stopped_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable stopped_;
};

TEST(UpdateLoop, AnApplyThatFailedIsReportedOverTheFetchItStopped) {
  Engine e;
  const auto w = testing::random_weights(layout(), 5);
  auto buckets = buckets_of(w, 2);
  buckets[1].bytes[0] ^= std::byte{1};
  StoppingSource source(std::move(buckets), true);
  std::string phase;
  const Error error =
      testing::error_of([&] { run_update(*e.engine, source, {2, "two", std::nullopt, &phase}); });
  EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA) << error.what();
  EXPECT_NE(std::string(error.what()).find("tensor 'c'"), std::string::npos) << error.what();
  EXPECT_EQ(phase, "apply bucket 1");
  EXPECT_FALSE(e.engine->active());
  EXPECT_FALSE(e.engine->version().committed);
  EXPECT_EQ(e.engine->metrics().updates_aborted, 1u);
}

}  // namespace
}  // namespace ferry::update
