// Release and resume over HTTP against a real `ferry serve` holding a ~66 MiB checkpoint: health
// says "released", the process's resident memory drops by about the weights' size, resume
// restores them (backup policy: bit-identical; discard policy: invalid until a disk update), and
// releasing or resuming twice is a 409 with a message.
#include <gtest/gtest.h>

#include <memory>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

// One layer, hidden 1024, vocab 4096, all F32: 66 MiB of weights.
DenseShape big_shape() {
  DenseShape s;
  s.vocab = 4096;
  s.hidden = 1024;
  s.q_rows = 1024;
  s.kv_rows = 256;
  s.head_dim = 128;
  s.intermediate = 2048;
  s.layers = 1;
  return s;
}

class ServeMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(
        make_dense_checkpoint(big_shape(), [](const std::string&) { return FERRY_DTYPE_F32; }, 3));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 2);
  }
  static void TearDownTestSuite() {
    checkpoint_.reset();
    dir_.reset();
  }

  static std::unique_ptr<ServeProcess> start(std::vector<std::string> sets) {
    ServeOptions o;
    o.model_path = model_path();
    o.token = "secret";
    o.sets = std::move(sets);
    return std::make_unique<ServeProcess>(o);
  }
  static std::string model_path() { return (dir_->path() / "model").string(); }
  static std::uint64_t weights_bytes() { return checkpoint_->total_bytes(); }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
};
std::unique_ptr<TempDir> ServeMemory::dir_;
std::unique_ptr<Checkpoint> ServeMemory::checkpoint_;

TEST_F(ServeMemory, BackupReleaseDropsResidentMemoryAndResumeRestoresTheSameWeights) {
  ASSERT_GT(weights_bytes(), 60u << 20);
  // The mirror's copy inside the commit, so that RSS after the load counts the whole mirror.
  auto serve = start({"memory.mirror_refresh=commit"});
  const auto before = serve->fingerprints();
  ASSERT_FALSE(before.empty());
  const std::uint64_t rss_loaded = serve->rss_bytes();

  const Reply release = serve->post("/release_memory_occupation", json::object(), serve->auth());
  ASSERT_EQ(release.status, 200) << release.text;
  EXPECT_EQ(release.body.value("success", false), true);
  ASSERT_TRUE(release.body["memory"].is_array());
  bool weights_tag_released = false;
  for (const auto& t : release.body["memory"]) {
    if (t.value("tag", "") == "weights") {
      weights_tag_released = t.value("released", false);
      EXPECT_EQ(t.value("policy", ""), "backup");
      // The region also holds the alignment padding between parameters.
      EXPECT_GE(t["bytes"].get<std::uint64_t>(), weights_bytes());
      EXPECT_LE(t["bytes"].get<std::uint64_t>(), weights_bytes() + (1u << 20));
    }
  }
  EXPECT_TRUE(weights_tag_released) << release.text;

  const Reply health = serve->get("/health");
  EXPECT_EQ(health.status, 503) << health.text;
  EXPECT_EQ(health.body.value("state", ""), "released");
  EXPECT_EQ(health.body.value("ready", true), false);

  const std::uint64_t rss_released = serve->rss_bytes();
  EXPECT_GE(rss_loaded, rss_released + weights_bytes() * 9 / 10)
      << "RSS loaded " << rss_loaded << ", released " << rss_released << ", weights "
      << weights_bytes();

  // Reading released weights is refused, not answered with garbage.
  const Reply prints_released = serve->get("/get_fingerprints");
  EXPECT_EQ(prints_released.status, 409) << prints_released.text;
  const Reply values_released = serve->weights("model.norm.weight", 4);
  EXPECT_EQ(values_released.status, 409) << values_released.text;

  const Reply twice = serve->post("/release_memory_occupation", json::object(), serve->auth());
  EXPECT_EQ(twice.status, 409) << twice.text;
  EXPECT_NE(twice.body.value("message", "").find("already released"), std::string::npos)
      << twice.text;
  const Reply tag_twice =
      serve->post("/release_memory_occupation", json{{"tags", {"weights"}}}, serve->auth());
  EXPECT_EQ(tag_twice.status, 409) << tag_twice.text;
  EXPECT_NE(tag_twice.body.value("message", "").find("'weights' is already released"),
            std::string::npos)
      << tag_twice.text;

  const Reply resume = serve->post("/resume_memory_occupation", json::object(), serve->auth());
  ASSERT_EQ(resume.status, 200) << resume.text;
  const Reply healthy = serve->get("/health");
  EXPECT_EQ(healthy.status, 200) << healthy.text;
  EXPECT_GE(serve->rss_bytes(), rss_released + weights_bytes() * 9 / 10);
  EXPECT_EQ(serve->fingerprints(), before);
  const Reply version = serve->get("/get_weight_version");
  EXPECT_EQ(version.body["version"].get<std::uint64_t>(), 1u);

  const Reply resume_twice =
      serve->post("/resume_memory_occupation", json::object(), serve->auth());
  EXPECT_EQ(resume_twice.status, 409) << resume_twice.text;
  EXPECT_NE(resume_twice.body.value("message", "").find("no tag is released"), std::string::npos)
      << resume_twice.text;
  const Reply tag_resume_twice =
      serve->post("/resume_memory_occupation", json{{"tags", {"weights"}}}, serve->auth());
  EXPECT_EQ(tag_resume_twice.status, 409) << tag_resume_twice.text;
  EXPECT_NE(tag_resume_twice.body.value("message", "").find("'weights' is not released"),
            std::string::npos)
      << tag_resume_twice.text;

  // A tag that does not exist is an error naming it.
  const Reply unknown =
      serve->post("/release_memory_occupation", json{{"tags", {"kv_cachez"}}}, serve->auth());
  EXPECT_GE(unknown.status, 400);
  EXPECT_LT(unknown.status, 500);
  EXPECT_NE(unknown.body.value("message", "").find("kv_cachez"), std::string::npos)
      << unknown.text;
  EXPECT_EQ(serve->get("/health").status, 200);
}

TEST_F(ServeMemory, DiscardResumeIsInvalidUntilADiskUpdateSucceeds) {
  auto serve = start({"memory.weights_policy=discard"});
  const auto before = serve->fingerprints();
  const std::uint64_t rss_loaded = serve->rss_bytes();

  const Reply release =
      serve->post("/release_memory_occupation", json{{"tags", {"weights"}}}, serve->auth());
  ASSERT_EQ(release.status, 200) << release.text;
  EXPECT_EQ(serve->get("/health").body.value("state", ""), "released");
  const std::uint64_t rss_released = serve->rss_bytes();
  EXPECT_GE(rss_loaded, rss_released + weights_bytes() * 9 / 10)
      << "RSS loaded " << rss_loaded << ", released " << rss_released;

  const Reply resume =
      serve->post("/resume_memory_occupation", json{{"tags", {"weights"}}}, serve->auth());
  ASSERT_EQ(resume.status, 200) << resume.text;
  for (const auto& t : resume.body["memory"]) {
    if (t.value("tag", "") == "weights") {
      EXPECT_EQ(t.value("contents_valid", true), false);
    }
  }
  const Reply invalid = serve->get("/health");
  EXPECT_EQ(invalid.status, 503) << invalid.text;
  EXPECT_EQ(invalid.body.value("ready", true), false);
  EXPECT_EQ(invalid.body.value("state", ""), "invalid");
  EXPECT_FALSE(invalid.body.value("reason", "").empty());
  EXPECT_NE(serve->fingerprints(), before);  // the contents really were dropped

  // A failed update does not make the weights valid.
  const Reply bad = serve->update_from_disk(model_path() + "/missing.safetensors");
  EXPECT_EQ(bad.status, 404) << bad.text;
  EXPECT_EQ(serve->get("/health").status, 503);

  const Reply update = serve->update_from_disk(model_path());
  ASSERT_EQ(update.status, 200) << update.text;
  EXPECT_EQ(update.body["version"].get<std::uint64_t>(), 2u);
  const Reply healthy = serve->get("/health");
  EXPECT_EQ(healthy.status, 200) << healthy.text;
  EXPECT_EQ(serve->fingerprints(), before);
}

}  // namespace
}  // namespace ferry::test
