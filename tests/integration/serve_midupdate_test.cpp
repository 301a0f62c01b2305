// An update that fails after some of its buckets were written into live weights, on the real
// receiver (ferry::receiver::Receiver with the disk and dense plugins): the version does not
// advance, the failure is reported as an error, and the weights are either rolled back exactly
// (backup policy) or fenced with a reason naming the update (discard policy) until a full update.
//
// The failure is made in-process because no request through `ferry serve` can fail
// deterministically after its first bucket: the disk transport validates the whole checkpoint
// before reading, so every malformed file is refused before anything is written.
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <sstream>

#include "config/config.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using receiver::Receiver;

enum class Failure {
  kWrongEntryFingerprint,  // bucket 2 carries a wrong fingerprint for one of its tensors
  kMissingLastBucket,      // the sender stops before the last bucket; commit finds holes
  kWrongSenderFingerprint, // every bucket applies; the sender's parameter fingerprint differs
};

struct Case {
  config::ReleasePolicy policy;
  Failure failure;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.policy == config::ReleasePolicy::backup ? "Backup" : "Discard";
  switch (info.param.failure) {
    case Failure::kWrongEntryFingerprint: return name + "WrongEntryFingerprintInBucket2";
    case Failure::kMissingLastBucket: return name + "MissingLastBucket";
    case Failure::kWrongSenderFingerprint: return name + "WrongSenderFingerprintAtCommit";
  }
  return name;
}

constexpr std::size_t kTensorsPerBucket = 3;
constexpr std::uint32_t kBadBucket = 2;

// The checkpoint's tensors packed into buckets of kTensorsPerBucket (64-byte aligned entries,
// each with its fingerprint), as a trainer would send them.
std::vector<Receiver::Bucket> make_buckets(const Checkpoint& c) {
  const std::size_t count = (c.tensors.size() + kTensorsPerBucket - 1) / kTensorsPerBucket;
  std::vector<Receiver::Bucket> out;
  for (std::size_t b = 0; b < count; ++b) {
    manifest::Manifest m;
    m.bucket_index = static_cast<std::uint32_t>(b);
    m.bucket_count = static_cast<std::uint32_t>(count);
    Receiver::Bucket bucket;
    for (std::size_t i = b * kTensorsPerBucket;
         i < std::min(c.tensors.size(), (b + 1) * kTensorsPerBucket); ++i) {
      const Tensor& t = c.tensors[i];
      bucket.data.resize((bucket.data.size() + 63) / 64 * 64);
      manifest::Entry e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.offset = bucket.data.size();
      e.size = t.bytes.size();
      e.fingerprint = kernels::fingerprint_cpu(t.bytes.data(), t.bytes.size(), 1);
      const auto* src = reinterpret_cast<const std::byte*>(t.bytes.data());
      bucket.data.insert(bucket.data.end(), src, src + t.bytes.size());
      m.tensors.push_back(std::move(e));
    }
    m.bucket_bytes = bucket.data.size();
    bucket.manifest = manifest::encode(m);
    out.push_back(std::move(bucket));
  }
  return out;
}

// Re-encodes bucket `b`'s manifest with its first tensor's fingerprint flipped in one bit.
void corrupt_fingerprint(Receiver::Bucket& b) {
  manifest::Manifest m = manifest::decode(b.manifest);
  *m.tensors.front().fingerprint ^= 1;
  b.manifest = manifest::encode(m);
}

std::string first_tensor_name(const Receiver::Bucket& b) {
  return manifest::decode(b.manifest).tensors.front().name;
}

// The value of an unlabelled metric in Prometheus text.
double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(name + " ") || line.starts_with(name + "{")) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  throw std::runtime_error("no metric " + name + " in:\n" + text);
}

std::map<std::string, std::uint64_t> expected_fingerprints(const Checkpoint& c) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& [name, bytes] : dense_expected_params(c, "engine", 0, 1)) {
    out[name] = kernels::fingerprint_cpu(bytes.data(), bytes.size(), 1);
  }
  return out;
}

class MidUpdateFailure : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const auto bf16 = [](const std::string&) { return FERRY_DTYPE_BF16; };
    v1_ = make_dense_checkpoint(DenseShape{}, bf16, 21);
    v2_ = make_dense_checkpoint(DenseShape{}, bf16, 22);
    write_checkpoint(dir_.path() / "v1", v1_, 1);

    config_.receiver.model_family = "dense";
    config_.receiver.layout = config::Layout::engine;
    config_.update.apply_threads = 2;
    config_.memory.weights_policy = GetParam().policy;
    // Failures come right after the load here: the next update waits for the mirror's copy, so
    // a backup receiver always rolls back (the default pre-empts a copy still running).
    config_.memory.mirror_refresh = config::MirrorRefresh::complete;
    const fs::path disk = required_env("FERRY_DISK_PLUGIN");
    const fs::path dense = required_env("FERRY_DENSE_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), dense.parent_path()});
    receiver_ = std::make_unique<Receiver>(config_, *registry_);
    const auto report = receiver_->update_from_disk(dir_.path() / "v1", "v1");
    ASSERT_EQ(report.version.number, 1u);
    ASSERT_EQ(receiver_->fingerprints(), expected_fingerprints(v1_));
  }

  TempDir dir_;
  Checkpoint v1_, v2_;
  config::Config config_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<Receiver> receiver_;
};

TEST_P(MidUpdateFailure, VersionStaysAndWeightsAreRestoredOrFenced) {
  const Case c = GetParam();
  const auto before = receiver_->fingerprints();
  const double applied_before = metric(receiver_->metrics_text(), "ferry_buckets_applied_total");

  std::vector<Receiver::Bucket> buckets = make_buckets(v2_);
  ASSERT_GT(buckets.size(), kBadBucket + 1);
  std::map<std::string, std::uint64_t> sender;
  std::string named;  // what the error must name
  std::size_t applied = 0;  // buckets written before the failure
  switch (c.failure) {
    case Failure::kWrongEntryFingerprint:
      corrupt_fingerprint(buckets[kBadBucket]);
      named = first_tensor_name(buckets[kBadBucket]);
      applied = kBadBucket;
      break;
    case Failure::kMissingLastBucket:
      named = first_tensor_name(buckets.back());  // the parameter left unwritten
      buckets.pop_back();
      applied = buckets.size();
      break;
    case Failure::kWrongSenderFingerprint:
      sender = expected_fingerprints(v2_);
      sender["model.layers.1.mlp.down_proj.weight"] ^= 1;
      named = "model.layers.1.mlp.down_proj.weight";
      applied = buckets.size();
      break;
  }

  std::string message;
  try {
    receiver_->apply_update(buckets, 0, "v2", sender);
    ADD_FAILURE() << "the failed update was reported as a success";
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(named), std::string::npos) << message;

  // Buckets before the failure really were written into the live weights.
  const std::string metrics = receiver_->metrics_text();
  EXPECT_EQ(metric(metrics, "ferry_buckets_applied_total"), applied_before + applied);
  EXPECT_EQ(metric(metrics, "ferry_updates_aborted_total"), 1);
  EXPECT_EQ(metric(metrics, "ferry_updates_committed_total"), 1);
  EXPECT_EQ(metric(metrics, "ferry_weight_version"), 1);

  EXPECT_EQ(receiver_->version().number, 1u);
  EXPECT_EQ(receiver_->version().label, "v1");
  const auto health = receiver_->health();
  if (c.policy == config::ReleasePolicy::backup) {
    EXPECT_TRUE(health.ready) << health.state << ": " << health.reason;
    EXPECT_EQ(health.state, "ready");
    EXPECT_EQ(receiver_->fingerprints(), before);
    EXPECT_EQ(metric(metrics, "ferry_update_rollbacks_total"), 1);
    EXPECT_EQ(metric(metrics, "ferry_fenced"), 0);
  } else {
    EXPECT_FALSE(health.ready);
    EXPECT_EQ(health.state, "fenced");
    EXPECT_NE(health.reason.find("update 2"), std::string::npos) << health.reason;
    EXPECT_EQ(metric(metrics, "ferry_fenced"), 1);
    EXPECT_EQ(metric(metrics, "ferry_ready"), 0);
    EXPECT_NE(receiver_->fingerprints(), before);  // partial: some parameters hold v2 bytes
  }

  // A full update afterwards commits and clears any fence.
  const auto report = receiver_->apply_update(make_buckets(v2_), 0, "v2", expected_fingerprints(v2_));
  EXPECT_EQ(report.version.number, 2u);
  EXPECT_EQ(receiver_->version().label, "v2");
  EXPECT_TRUE(receiver_->health().ready) << receiver_->health().reason;
  EXPECT_EQ(receiver_->fingerprints(), expected_fingerprints(v2_));
  const std::string after = receiver_->metrics_text();
  EXPECT_EQ(metric(after, "ferry_updates_committed_total"), 2);
  EXPECT_EQ(metric(after, "ferry_weight_version"), 2);
  EXPECT_NE(after.find("ferry_weight_version{label=\"v2\"} 2"), std::string::npos) << after;
  EXPECT_EQ(metric(after, "ferry_fenced"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    PoliciesAndFailures, MidUpdateFailure,
    ::testing::Values(Case{config::ReleasePolicy::backup, Failure::kWrongEntryFingerprint},
                      Case{config::ReleasePolicy::backup, Failure::kMissingLastBucket},
                      Case{config::ReleasePolicy::backup, Failure::kWrongSenderFingerprint},
                      Case{config::ReleasePolicy::discard, Failure::kWrongEntryFingerprint},
                      Case{config::ReleasePolicy::discard, Failure::kMissingLastBucket},
                      Case{config::ReleasePolicy::discard, Failure::kWrongSenderFingerprint}),
    case_name);

// A fenced receiver is also cleared by a disk reload (update_weights_from_disk).
TEST(MidUpdateFailureDisk, DiskReloadClearsTheFence) {
  TempDir dir;
  const auto bf16 = [](const std::string&) { return FERRY_DTYPE_BF16; };
  const Checkpoint v1 = make_dense_checkpoint(DenseShape{}, bf16, 31);
  const Checkpoint v2 = make_dense_checkpoint(DenseShape{}, bf16, 32);
  write_checkpoint(dir.path() / "v1", v1, 1);
  write_checkpoint(dir.path() / "v2", v2, 2);
  config::Config config;
  config.receiver.model_family = "dense";
  config.memory.weights_policy = config::ReleasePolicy::discard;
  const fs::path disk = required_env("FERRY_DISK_PLUGIN");
  const fs::path dense = required_env("FERRY_DENSE_PLUGIN");
  registry::Registry registry({disk.parent_path(), dense.parent_path()});
  Receiver receiver(config, registry);
  receiver.update_from_disk(dir.path() / "v1", std::nullopt);

  auto buckets = make_buckets(v2);
  corrupt_fingerprint(buckets[kBadBucket]);
  EXPECT_THROW(receiver.apply_update(buckets, 0, std::nullopt), Error);
  ASSERT_EQ(receiver.health().state, "fenced");

  const auto report = receiver.update_from_disk(dir.path() / "v2", std::nullopt);
  EXPECT_EQ(report.version.number, 2u);
  EXPECT_TRUE(receiver.health().ready) << receiver.health().reason;
  EXPECT_EQ(receiver.fingerprints(), expected_fingerprints(v2));
}

}  // namespace
}  // namespace ferry::test
