// Restart without the trainer (memory.mirror_path) against real `ferry serve` processes: a
// receiver killed with SIGKILL after version V committed comes back serving version V from its
// file-backed host mirror (same version, label and fingerprints, the initial checkpoint's weights
// not loaded), with or without receiver.model_path; a mirror that is truncated, damaged, of a
// refresh the kill interrupted, or of another model is refused with the file and the reason and
// the receiver starts from the initial checkpoint instead; a second receiver on a mirror in use
// refuses to start. FERRY_TEST_DEVICE (default cpu) is receiver.device: built with CUDA, the
// same tests run as integration_serve_restart_cuda with the weights on the GPU (the mirror is then
// the page-locked host copy the CUDA store restores from).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The first `n` values of every tensor of `checkpoint` are what `serve` answers for it
// (tp_size 1: each parameter holds its whole checkpoint tensor).
::testing::AssertionResult serves(const ServeProcess& serve, const Checkpoint& checkpoint) {
  for (const Tensor& t : checkpoint.tensors) {
    const Reply reply = serve.weights(t.name, 64);
    if (reply.status != 200) {
      return ::testing::AssertionFailure() << t.name << ": " << reply.status << " " << reply.text;
    }
    const auto values = reply.body["values"].get<std::vector<double>>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i] != decode_element(t.dtype, t.bytes.data(), i)) {
        return ::testing::AssertionFailure() << t.name << " element " << i << " differs";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// receiver.device of every receiver: FERRY_TEST_DEVICE, default cpu.
std::string test_device() {
  const char* device = std::getenv("FERRY_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

// SIGKILL, then reaped (its lock on the mirror file is gone once it is).
void kill_hard(std::unique_ptr<ServeProcess>& serve) {
  ASSERT_EQ(::kill(serve->pid(), SIGKILL), 0);
  serve->terminate(10);
  serve.reset();
}

std::uint64_t read_u64(const fs::path& path, std::streamoff offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  std::uint64_t value = 0;
  in.read(reinterpret_cast<char*>(&value), sizeof value);
  return value;
}

void flip_byte(const fs::path& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x01));
}

class ServeRestart : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    models_ = std::make_unique<TempDir>();
    const auto f32 = [](const std::string&) { return FERRY_DTYPE_F32; };
    const auto bf16 = [](const std::string& name) {
      return name.find("norm") != std::string::npos ? FERRY_DTYPE_F32 : FERRY_DTYPE_BF16;
    };
    initial_ = std::make_unique<Checkpoint>(make_dense_checkpoint(DenseShape{}, bf16, 1));
    trained_ = std::make_unique<Checkpoint>(make_dense_checkpoint(DenseShape{}, bf16, 2));
    write_checkpoint(models_->path() / "initial", *initial_);
    write_checkpoint(models_->path() / "trained", *trained_);
    // Another model: the same names, every tensor F32 (another dtype), and a larger vocabulary.
    DenseShape other_shape;
    other_shape.vocab = 32;
    other_ = std::make_unique<Checkpoint>(make_dense_checkpoint(other_shape, f32, 3));
    write_checkpoint(models_->path() / "other", *other_);
  }
  static void TearDownTestSuite() {
    initial_.reset();
    trained_.reset();
    other_.reset();
    models_.reset();
  }

  static std::string model(const char* name) { return (models_->path() / name).string(); }

  ServeOptions options(const std::string& model_path) const {
    ServeOptions o;
    o.model_path = model_path;
    o.sets = {"memory.mirror_path=" + mirror_.string(), "receiver.device=" + test_device()};
    o.log_level = "info";
    return o;
  }

  // A receiver that loaded `initial`, committed `trained` as version 2 labelled "step-2" (the
  // relabel waits for the mirror's refresh of version 2), and was then killed with SIGKILL.
  // Returns its fingerprints.
  std::map<std::string, std::string> commit_version_2_and_kill() {
    auto serve = std::make_unique<ServeProcess>(options(model("initial")));
    const Reply update = serve->update_from_disk(model("trained"));
    EXPECT_EQ(update.status, 200) << update.text;
    EXPECT_EQ(update.body.value("version", 0u), 2u) << update.text;
    const Reply relabel = serve->post("/update_weight_version", json{{"new_version", "step-2"}});
    EXPECT_EQ(relabel.status, 200) << relabel.text;
    auto prints = serve->fingerprints();
    kill_hard(serve);
    return prints;
  }

  // Starts a receiver on the damaged mirror with the initial checkpoint and checks that it says
  // why the file is refused (`reason`), names the file, and serves the initial checkpoint as
  // version 1.
  void expect_refused_and_started_from_the_initial_checkpoint(const std::string& reason) {
    ServeProcess serve(options(model("initial")));
    const Reply health = serve.get("/health");
    EXPECT_EQ(health.status, 200) << health.text;
    const Reply version = serve.get("/get_weight_version");
    EXPECT_EQ(version.body.value("version", 0u), 1u) << version.text;
    EXPECT_TRUE(serves(serve, *initial_));
    const std::string log = serve.log();
    EXPECT_NE(log.find("[warning]"), std::string::npos) << log;
    EXPECT_NE(log.find(mirror_.string()), std::string::npos) << log;
    EXPECT_NE(log.find(reason), std::string::npos) << log;
    EXPECT_NE(log.find("the receiver loads the initial checkpoint '" + model("initial") +
                       "' instead"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("restored version"), std::string::npos) << log;
  }

  // Under /dev/shm where there is one (where a mirror belongs: a CUDA store page-locks it).
  static fs::path mirror_file() {
    const fs::path shm = "/dev/shm";
    const auto dir = fs::is_directory(shm) ? shm : fs::temp_directory_path();
    return dir / ("ferry-restart-test-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove(mirror_); }

  fs::path mirror_ = mirror_file();

  static std::unique_ptr<TempDir> models_;
  static std::unique_ptr<Checkpoint> initial_, trained_, other_;
};
std::unique_ptr<TempDir> ServeRestart::models_;
std::unique_ptr<Checkpoint> ServeRestart::initial_;
std::unique_ptr<Checkpoint> ServeRestart::trained_;
std::unique_ptr<Checkpoint> ServeRestart::other_;

TEST_F(ServeRestart, AKilledReceiverComesBackServingItsLastCommittedVersion) {
  const auto before = commit_version_2_and_kill();
  ASSERT_FALSE(before.empty());

  auto serve = std::make_unique<ServeProcess>(options(model("initial")));
  const Reply health = serve->get("/health");
  EXPECT_EQ(health.status, 200) << health.text;
  const Reply version = serve->get("/get_weight_version");
  EXPECT_EQ(version.body.value("version", 0u), 2u) << version.text;
  EXPECT_EQ(version.body.value("weight_version", ""), "step-2") << version.text;
  EXPECT_EQ(serve->fingerprints(), before);
  EXPECT_TRUE(serves(*serve, *trained_));
  const std::string log = serve->log();
  EXPECT_NE(log.find("restored version 2 ('step-2') from " + mirror_.string() + ", written at "),
            std::string::npos)
      << log;
  // The initial checkpoint gave the layout (its headers) and nothing else.
  EXPECT_EQ(log.find("from disk:"), std::string::npos) << log;
  EXPECT_EQ(log.find("[warning]"), std::string::npos) << log;

  // Updates go on from version 2, and the next restart finds version 3.
  const Reply update = serve->update_from_disk(model("initial"));
  ASSERT_EQ(update.status, 200) << update.text;
  EXPECT_EQ(update.body.value("version", 0u), 3u) << update.text;
  ASSERT_EQ(serve->post("/update_weight_version", json{{"new_version", "step-3"}}).status, 200);
  kill_hard(serve);
  ServeProcess again(options(model("trained")));
  EXPECT_EQ(again.get("/get_weight_version").body.value("weight_version", ""), "step-3");
  EXPECT_TRUE(serves(again, *initial_));
}

TEST_F(ServeRestart, WithoutAModelPathTheLayoutComesFromTheMirror) {
  std::map<std::string, std::string> before;
  {
    auto serve = std::make_unique<ServeProcess>(options(""));
    EXPECT_EQ(serve->get("/health").body.value("state", ""), "empty");
    ASSERT_EQ(serve->update_from_disk(model("trained")).status, 200);
    ASSERT_EQ(serve->post("/update_weight_version", json{{"new_version", "rl-7"}}).status, 200);
    before = serve->fingerprints();
    kill_hard(serve);
  }
  ServeProcess serve(options(""));
  EXPECT_EQ(serve.get("/health").status, 200);
  const Reply version = serve.get("/get_weight_version");
  EXPECT_EQ(version.body.value("version", 0u), 1u) << version.text;
  EXPECT_EQ(version.body.value("weight_version", ""), "rl-7") << version.text;
  EXPECT_EQ(serve.fingerprints(), before);
  EXPECT_TRUE(serves(serve, *trained_));
  EXPECT_NE(serve.log().find("restored version 1 ('rl-7') from " + mirror_.string()),
            std::string::npos)
      << serve.log();
}

TEST_F(ServeRestart, ATruncatedMirrorIsRefused) {
  commit_version_2_and_kill();
  fs::resize_file(mirror_, fs::file_size(mirror_) - 4096);
  expect_refused_and_started_from_the_initial_checkpoint("bytes but the header describes");
}

TEST_F(ServeRestart, AFlippedHeaderByteIsRefused) {
  commit_version_2_and_kill();
  // The committed version number (after magic, format, flag and five u64 fields): 2 -> 3.
  flip_byte(mirror_, 8 + 4 + 4 + 5 * 8);
  expect_refused_and_started_from_the_initial_checkpoint(
      "the record of committed version 3 is damaged");
}

TEST_F(ServeRestart, AFlippedWeightByteIsRefused) {
  commit_version_2_and_kill();
  // The first byte of the data area (its offset is the header's third field).
  flip_byte(mirror_, static_cast<std::streamoff>(read_u64(mirror_, 16)));
  expect_refused_and_started_from_the_initial_checkpoint(
      "does not match the fingerprint recorded for version 2");
}

TEST_F(ServeRestart, AMirrorMarkedMidRefreshIsRefused) {
  commit_version_2_and_kill();
  // What a receiver leaves when it dies as a refresh starts: the committed flag cleared (the
  // word after the format version) and nothing else touched.
  {
    std::fstream f(mirror_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    const std::uint32_t zero = 0;
    f.write(reinterpret_cast<const char*>(&zero), sizeof zero);
  }
  expect_refused_and_started_from_the_initial_checkpoint("holds no committed version to restore");
}

// ~200 MiB of F32 weights (written once), copied and applied on one thread in 16 MiB buckets:
// an update and the mirror's copy of it take tens of ms or more. On a GPU (device-to-host at
// ~55 GB/s) eight times as much.
std::string big_model(const fs::path& dir) {
  const fs::path path = dir / "big";
  if (fs::exists(path / "model.safetensors")) return path.string();
  DenseShape big;
  big.vocab = test_device() != "cpu" ? 131072 : 16384;
  big.hidden = 1536;
  big.q_rows = 1536;
  big.kv_rows = 256;
  big.head_dim = 128;
  big.intermediate = 2048;
  big.layers = 1;
  const auto checkpoint =
      make_dense_checkpoint(big, [](const std::string&) { return FERRY_DTYPE_F32; }, 4);
  write_checkpoint(path, checkpoint);
  return path.string();
}

TEST_F(ServeRestart, AReceiverKilledDuringTheBackgroundRefreshLeavesNothingToRestore) {
  // The SIGKILL follows the update's reply within about a millisecond. Every refresh is held
  // 3 s before its first copy (a hidden test option: a copy of a few hundred MiB alone ends
  // within tens of ms, which a loaded machine running the test under a sanitizer once missed),
  // so the kill surely lands inside version 2's refresh.
  const std::string path = big_model(models_->path());
  ServeOptions o = options(path);
  o.sets.push_back("update.apply_threads=1");
  o.sets.push_back("update.bucket_bytes=16777216");
  o.serve_args = {"--test-mirror-refresh-delay-ms", "3000"};
  {
    auto serve = std::make_unique<ServeProcess>(o);
    // Version 1's refresh has ended once the relabel returns.
    ASSERT_EQ(serve->post("/update_weight_version", json{{"new_version", "one"}}).status, 200);
    const Reply update = serve->update_from_disk(path);
    ASSERT_EQ(update.status, 200) << update.text;
    kill_hard(serve);
  }
  ServeProcess serve(o);
  EXPECT_EQ(serve.get("/get_weight_version").body.value("version", 0u), 1u);
  EXPECT_EQ(serve.get("/health").status, 200);
  const std::string log = serve.log();
  EXPECT_NE(log.find("host mirror " + mirror_.string() +
                     " holds no committed version to restore: the copy of version 2 into the "
                     "mirror began and did not end"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("restored version"), std::string::npos) << log;
}

TEST_F(ServeRestart, AReceiverKilledDuringAnUpdateComesBackAtTheVersionBefore) {
  const std::string path = big_model(models_->path());
  ServeOptions o = options(path);
  o.sets.push_back("update.apply_threads=1");
  o.sets.push_back("update.read_threads=1");
  o.sets.push_back("update.bucket_bytes=1048576");
  std::map<std::string, std::string> before;
  {
    auto serve = std::make_unique<ServeProcess>(o);
    ASSERT_EQ(serve->post("/update_weight_version", json{{"new_version", "one"}}).status, 200);
    before = serve->fingerprints();
    // Update 2 runs on another thread; the receiver is killed once /health says it is applying.
    std::thread update([&] { serve->update_from_disk(path); });
    bool updating = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!updating && std::chrono::steady_clock::now() < deadline) {
      updating = serve->get("/health").body.value("state", "") == "updating";
    }
    if (updating) ::kill(serve->pid(), SIGKILL);
    update.join();
    ASSERT_TRUE(updating) << "update 2 was never seen in progress";
    kill_hard(serve);
  }
  ServeProcess serve(o);
  const Reply version = serve.get("/get_weight_version");
  EXPECT_EQ(version.body.value("version", 0u), 1u) << version.text;
  EXPECT_EQ(version.body.value("weight_version", ""), "one") << version.text;
  EXPECT_EQ(serve.get("/health").status, 200);
  EXPECT_EQ(serve.fingerprints(), before);
  EXPECT_NE(serve.log().find("restored version 1 ('one')"), std::string::npos) << serve.log();
}

TEST_F(ServeRestart, ACleanShutdownRightAfterACommitLeavesThatVersion) {
  {
    ServeProcess serve(options(model("initial")));
    ASSERT_EQ(serve.update_from_disk(model("trained")).status, 200);
    EXPECT_EQ(serve.terminate(10), std::optional<int>(0));
  }
  ServeProcess serve(options(model("initial")));
  EXPECT_EQ(serve.get("/get_weight_version").body.value("version", 0u), 2u);
  EXPECT_TRUE(serves(serve, *trained_));
}

TEST_F(ServeRestart, WithPolicyDiscardTheMirrorPathIsNotUsedAndAWarningSaysSo) {
  ServeOptions o = options(model("initial"));
  o.sets.push_back("memory.weights_policy=discard");
  ServeProcess serve(o);
  EXPECT_EQ(serve.get("/health").status, 200);
  EXPECT_NE(serve.log().find("[warning] memory.mirror_path " + mirror_.string() +
                             " is not used: the host mirror needs memory.weights_policy = "
                             "\"backup\""),
            std::string::npos)
      << serve.log();
  EXPECT_FALSE(fs::exists(mirror_));
}

TEST_F(ServeRestart, AnotherModelIsRefusedNamingTheFirstDifference) {
  commit_version_2_and_kill();
  auto serve = std::make_unique<ServeProcess>(options(model("other")));
  EXPECT_EQ(serve->get("/get_weight_version").body.value("version", 0u), 1u);
  EXPECT_TRUE(serves(*serve, *other_));
  const std::string log = serve->log();
  EXPECT_NE(log.find("host mirror " + mirror_.string() + ": version 2 is not restored: host mirror " +
                     mirror_.string() + ": layout differs from this store: parameter 0 is"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("the receiver loads the initial checkpoint '" + model("other") + "' instead"),
            std::string::npos)
      << log;
  // The file now mirrors the other model: the next restart restores it.
  ASSERT_EQ(serve->post("/update_weight_version", json{{"new_version", "other-1"}}).status, 200);
  kill_hard(serve);
  ServeProcess again(options(model("other")));
  EXPECT_EQ(again.get("/get_weight_version").body.value("weight_version", ""), "other-1");
  EXPECT_NE(again.log().find("restored version 1 ('other-1')"), std::string::npos) << again.log();
}

TEST_F(ServeRestart, ASecondReceiverOnAMirrorInUseRefusesToStart) {
  ServeProcess first(options(model("initial")));
  ServeOptions o = options(model("initial"));
  o.ready_deadline_s = 30;
  try {
    ServeProcess second(o);
    FAIL() << "a second receiver started on a mirror in use";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another running process"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(first.get("/health").status, 200);
}

}  // namespace
}  // namespace ferry::test
