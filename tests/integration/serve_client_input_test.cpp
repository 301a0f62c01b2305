// Mistaken and hostile client input to a real `ferry serve`, each refused at once with a message
// (400, or 409 for a version), after which the receiver goes on serving and updating: paths that
// are FIFOs, devices or hold NUL bytes (model_path, a shard, config.json, a ZMQ address, an NCCL
// rendezvous address), get_weights_by_name past its maximum, versions that do not increase
// (`ferry push` and a kept in-process session), and the token taken from a file or FERRY_TOKEN
// instead of the command line (`ferry serve`, `ferry push`).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <memory>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "tests/session/session_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string message_of(const Reply& r) {
  return r.body.is_object() ? r.body.value("message", std::string()) : r.text;
}

void write_text(const fs::path& file, const std::string& text, fs::perms perms) {
  std::ofstream(file, std::ios::trunc) << text;
  fs::permissions(file, perms);
}

// One receiver per suite, loaded with v1 (version 1, weight_version "1").
class ClientInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    versions_ = std::make_unique<TwoVersions>();
    serve_ = std::make_unique<ServeProcess>(receiver_options(versions_->v1_path()));
  }
  static void TearDownTestSuite() {
    serve_.reset();
    versions_.reset();
  }

  // The receiver is healthy, at `version`, holding `checkpoint`.
  static void expect_serving(long long version, const Checkpoint& checkpoint) {
    EXPECT_EQ(serve_->get("/health").status, 200);
    EXPECT_EQ(version_of(*serve_), version);
    EXPECT_EQ(serve_->fingerprints(), expected_fingerprints(checkpoint, 0, 1));
  }

  // A refusal within a few seconds (a blocked open would wait for the client's 120 s timeout).
  static void expect_refused_at_once(const std::string& model_path, int status,
                                     const std::string& words) {
    const auto start = Clock::now();
    const Reply r = serve_->update_from_disk(model_path);
    EXPECT_LT(seconds_since(start), 5.0) << model_path;
    EXPECT_EQ(r.status, status) << r.text;
    EXPECT_NE(message_of(r).find(words), std::string::npos)
        << "'" << message_of(r) << "' lacks '" << words << "'";
  }

  // A disk update of v1 commits (the update lock is free), as the next version.
  static void expect_disk_update_commits() {
    const long long before = version_of(*serve_);
    const Reply r = serve_->update_from_disk(versions_->v1_path());
    ASSERT_EQ(r.status, 200) << r.text;
    EXPECT_EQ(r.body["version"].get<long long>(), before + 1);
    expect_serving(before + 1, versions_->v1);
  }

  static std::unique_ptr<TwoVersions> versions_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TwoVersions> ClientInput::versions_;
std::unique_ptr<ServeProcess> ClientInput::serve_;

TEST_F(ClientInput, FifoAsModelPathIsRefusedAtOnceAndTheNextUpdateRuns) {
  TempDir dir;
  const std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused_at_once(fifo, 400, fifo + "' is a FIFO (named pipe)");
  expect_disk_update_commits();  // not 409: no update lock was left held
}

TEST_F(ClientInput, FifoAsOneShardIsRefusedAtOnceAndTheNextUpdateRuns) {
  TempDir dir;
  write_checkpoint(dir.path(), versions_->v2, 2);
  const std::string shard = dir.file("model-00002-of-00002.safetensors");
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  expect_refused_at_once(dir.path().string(), 400, shard + ": is a FIFO (named pipe)");
  // The same without an index: the folder's FIFO is refused, not skipped.
  fs::remove(dir.file("model.safetensors.index.json"));
  expect_refused_at_once(dir.path().string(), 400, shard + ": is a FIFO (named pipe)");
  expect_disk_update_commits();
}

TEST_F(ClientInput, DevicesAreRefusedAsClientMistakes) {
  expect_refused_at_once("/dev/zero", 400, "'/dev/zero' is a character device");
  TempDir dir;
  write_checkpoint(dir.path(), versions_->v2, 2);
  const std::string shard = dir.file("model-00001-of-00002.safetensors");
  fs::remove(shard);
  fs::create_symlink("/dev/zero", shard);
  expect_refused_at_once(dir.path().string(), 400, shard + ": is a character device");
  expect_serving(version_of(*serve_), versions_->v1);
}

// A NUL byte ends the path for the C calls under it: "v1\0junk" would load v1. Refused instead.
TEST_F(ClientInput, NulBytesInPathsAndAddressesAreRefused) {
  const long long version = version_of(*serve_);
  const std::string cut = versions_->v1_path() + std::string("\0/../elsewhere", 14);
  expect_refused_at_once(cut, 400, "model_path holds a NUL byte at offset");
  expect_serving(version, versions_->v1);

  const Reply ipc = serve_->post(
      "/update_weights_from_ipc",
      json{{"zmq_handles", {{"GPU-0", std::string("ipc:///tmp/a\0b", 14)}}}});
  EXPECT_EQ(ipc.status, 400) << ipc.text;
  EXPECT_NE(message_of(ipc).find("zmq_handles['GPU-0'] holds a NUL byte"), std::string::npos)
      << ipc.text;

  const Reply nccl = serve_->post(
      "/init_weights_update_group",
      json{{"master_address", std::string("127.0.0.1\0evil", 14)}, {"master_port", 29500},
           {"rank_offset", 1}, {"world_size", 2}});
  EXPECT_EQ(nccl.status, 400) << nccl.text;
  EXPECT_NE(message_of(nccl).find("field 'master_address' holds a NUL byte"), std::string::npos)
      << nccl.text;
  expect_serving(version, versions_->v1);
}

TEST_F(ClientInput, ConfigJsonThatIsAFifoIsRefusedAtTheFirstLoad) {
  TempDir dir;
  write_checkpoint(dir.path(), versions_->v2, 1);
  const std::string config = dir.file("config.json");
  fs::remove(config);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  ServeOptions o = receiver_options("");
  o.model_family = "";  // detected from config.json: the first load reads it
  ServeProcess fresh(o);
  const auto start = Clock::now();
  const Reply r = fresh.update_from_disk(dir.path().string());
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_NE(message_of(r).find(config + " is a FIFO (named pipe), not a regular file"),
            std::string::npos)
      << r.text;
  const Reply good = fresh.update_from_disk(versions_->v1_path());
  EXPECT_EQ(good.status, 200) << good.text;
}

// An empty model_family is detected by receiver.model_family_hints (data in the config, not
// names in the host): a hint that matches the checkpoint's architecture routes it to its plugin;
// with none matching, the load is refused naming the key, and nothing is loaded.
TEST_F(ClientInput, ModelFamilyHintsDecideTheDetectedFamily) {
  ServeOptions none = receiver_options("");
  none.model_family = "";
  none.sets = {"receiver.model_family_hints=['nosuch=dense']"};
  ServeProcess unmatched(none);
  const Reply refused = unmatched.update_from_disk(versions_->v1_path());
  EXPECT_EQ(refused.status, 400) << refused.text;
  EXPECT_NE(message_of(refused).find("receiver.model_family_hints has no match"),
            std::string::npos)
      << refused.text;
  EXPECT_EQ(version_of(unmatched), 0);

  ServeOptions hinted = receiver_options("");
  hinted.model_family = "";
  hinted.sets = {"receiver.model_family_hints=['nosuch=moe', 'qwen3=dense']"};
  ServeProcess matched(hinted);
  const Reply loaded = matched.update_from_disk(versions_->v1_path());
  ASSERT_EQ(loaded.status, 200) << loaded.text;
  EXPECT_EQ(matched.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
}

TEST_F(ClientInput, TruncateSizeIsBoundedAndReturnsWhatItAsks) {
  // A receiver whose embedding has 8192 x 16 = 131072 values, twice the maximum.
  TempDir big_dir;
  DenseShape big_shape;
  big_shape.vocab = 8192;
  big_shape.hidden = 16;
  write_checkpoint(big_dir.path(),
                   make_dense_checkpoint(big_shape, [](const std::string&) { return FERRY_DTYPE_F32; }, 5),
                   1);
  ServeProcess big(receiver_options(big_dir.path().string()));
  const std::string name = "model.embed_tokens.weight";
  const Reply over = big.weights(name, (1u << 16) + 1);
  EXPECT_EQ(over.status, 400) << over.text;
  EXPECT_NE(message_of(over).find("truncate_size 65537 would return 65537 of the 131072 values of "
                                  "'model.embed_tokens.weight', more than the maximum of 65536"),
            std::string::npos)
      << over.text;
  const Reply huge = big.weights(name, 1ull << 62);
  EXPECT_EQ(huge.status, 400) << huge.text;
  const Reply cap = big.weights(name, 1u << 16);
  ASSERT_EQ(cap.status, 200) << cap.text;
  EXPECT_EQ(cap.body["values"].size(), 1u << 16);

  // A larger truncate_size of a tensor within the maximum returns all of it.
  const Reply most = serve_->weights(name, 1ull << 62);
  ASSERT_EQ(most.status, 200) << most.text;
  EXPECT_EQ(most.body["values"].size(), versions_->v1.at(name).elements());
  const Reply three = serve_->weights(name, 3);
  ASSERT_EQ(three.status, 200) << three.text;
  EXPECT_EQ(three.body["values"].size(), 3u);
}

// `ferry push` with a version that does not increase is refused by the receiver (409 in its
// words: both versions named); a higher one commits; a disk update then takes the next number.
TEST_F(ClientInput, VersionsOnlyIncrease) {
  auto push = [&](const std::string& path, const std::string& version) {
    return run_ferry({"--log-level", "warn", "push", "--to", address_of(*serve_), "--transport",
                      "inline", "--model-path", path, "--version", version});
  };
  const long long start = version_of(*serve_);
  const auto first = push(versions_->v2_path(), "50");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_serving(50, versions_->v2);

  for (const char* stale : {"10", "50"}) {
    const auto refused = push(versions_->v1_path(), stale);
    EXPECT_NE(refused.status, 0) << refused.output;
    EXPECT_NE(refused.output.find("update version " + std::string(stale) +
                                  " is not newer than the published version 50"),
              std::string::npos)
        << refused.output;
    expect_serving(50, versions_->v2);
  }
  const auto higher = push(versions_->v1_path(), "51");
  ASSERT_EQ(higher.status, 0) << higher.output;
  expect_serving(51, versions_->v1);
  expect_disk_update_commits();  // 52
  EXPECT_GT(version_of(*serve_), start);
}

// The same through one in-process Sender, whose session is kept between pushes: the refusal
// names both versions, and the next push with a higher version commits.
TEST_F(ClientInput, AKeptSessionIsRefusedAnOldVersionAndGoesOn) {
  config::Config config;
  registry::Registry registry({});
  session::SenderOptions options;
  options.receivers = {address_of(*serve_)};
  options.transport = "inline";
  options.bucket_bytes = 512;
  session::Sender sender(config, registry, options);
  const auto base = static_cast<std::uint64_t>(version_of(*serve_));
  const auto v2 = views_of(versions_->v2);
  ASSERT_TRUE(sender.push(v2, base + 5).all_committed());
  const auto stale = sender.push(v2, base + 1);
  ASSERT_EQ(stale.receivers.size(), 1u);
  EXPECT_FALSE(stale.receivers[0].committed);
  EXPECT_EQ(stale.receivers[0].code, FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(stale.receivers[0].error.find(
                fmt::format("is not newer than the published version {}", base + 5)),
            std::string::npos)
      << stale.receivers[0].error;
  const auto v1 = views_of(versions_->v1);
  ASSERT_TRUE(sender.push(v1, base + 6).all_committed());
  expect_serving(static_cast<long long>(base + 6), versions_->v1);
}

// ---- the token, kept off the command line -------------------------------------------------

httplib::Headers bearer(const std::string& token) {
  return {{"Authorization", "Bearer " + token}};
}

std::string command_line(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Mutating routes need the token given by `options`; it is not in the process's command line.
void expect_token_required(ServeOptions options, const std::string& token,
                           const std::string& model_path) {
  ServeProcess serve(std::move(options));
  const json body{{"model_path", model_path}};
  EXPECT_EQ(serve.post("/update_weights_from_disk", body).status, 401);
  EXPECT_EQ(serve.post("/update_weights_from_disk", body, bearer("wrong")).status, 401);
  const Reply ok = serve.post("/update_weights_from_disk", body, bearer(token));
  EXPECT_EQ(ok.status, 200) << ok.text;
  EXPECT_EQ(command_line(serve.pid()).find(token), std::string::npos);
}

TEST_F(ClientInput, ServeTakesTheTokenFromAFileOrTheEnvironment) {
  TempDir dir;
  const fs::path file = dir.path() / "token";
  write_text(file, "file-secret-1\n", fs::perms::owner_read | fs::perms::owner_write);
  ServeOptions from_file = receiver_options("");
  from_file.serve_args = {"--token-file", file.string()};
  expect_token_required(from_file, "file-secret-1", versions_->v1_path());

  ServeOptions from_env = receiver_options("");
  from_env.env = {{"FERRY_TOKEN", "env-secret-2"}};
  expect_token_required(from_env, "env-secret-2", versions_->v1_path());
}

TEST_F(ClientInput, ServeRefusesATokenFileEveryUserCanRead) {
  TempDir dir;
  const fs::path file = dir.path() / "token";
  write_text(file, "s3cret\n", fs::perms::owner_read | fs::perms::owner_write |
                                   fs::perms::group_read | fs::perms::others_read);
  ServeOptions o = receiver_options("");
  o.serve_args = {"--token-file", file.string()};
  try {
    ServeProcess serve(o);
    ADD_FAILURE() << "ferry serve started with a world-readable token file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("can be read or written by every user (mode 644); "
                                         "chmod 600 it"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ClientInput, PushTakesTheTokenFromAFileOrTheEnvironment) {
  ServeOptions o = receiver_options(versions_->v1_path());
  o.env = {{"FERRY_TOKEN", "push-secret"}};
  ServeProcess serve(o);
  TempDir dir;
  const fs::path file = dir.path() / "token";
  write_text(file, "push-secret", fs::perms::owner_read);
  auto push = [&](std::vector<std::string> extra, const std::map<std::string, std::string>& env,
                  const std::string& version) {
    std::vector<std::string> args = {"--log-level", "warn",         "push",  "--to",
                                     address_of(serve), "--transport", "inline", "--model-path",
                                     versions_->v2_path(), "--version", version};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_ferry(args, env);
  };
  const auto without = push({}, {{"FERRY_TOKEN", ""}}, "2");
  EXPECT_NE(without.status, 0) << without.output;
  const auto by_file = push({"--token-file", file.string()}, {{"FERRY_TOKEN", ""}}, "3");
  EXPECT_EQ(by_file.status, 0) << by_file.output;
  const auto by_env = push({}, {{"FERRY_TOKEN", "push-secret"}}, "4");
  EXPECT_EQ(by_env.status, 0) << by_env.output;
  EXPECT_EQ(version_of(serve), 4);
}

}  // namespace
}  // namespace ferry::test
