// tests/control/vllm_engine_test.cpp: vLLM's pause, sleep and weight-update routes reaching an
// embedded engine's callbacks: a real Receiver (disk and dense plugins) with recording engine
// callbacks behind a real ControlServer, in-process because `ferry serve` registers no engine.
// Checks the mode mapping (abort -> abort, keep -> in_place, wait refused), clear_cache, the
// kv_cache tag released and resumed through the engine, generation resumed by the last wake-up
// (and again when a sleep fails half-way), and post-load processing at finish_weight_update.
#include <gtest/gtest.h>

#include <httplib.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "control/http_server.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What the engine was asked, in order ("pause:abort", "flush", "memory:kv_cache:release", ...).
struct EngineLog {
  std::mutex mutex;
  std::vector<std::string> calls;
  bool fail_memory = false;
  void add(std::string call) {
    const std::lock_guard lock(mutex);
    calls.push_back(std::move(call));
  }
  std::vector<std::string> take() {
    const std::lock_guard lock(mutex);
    return std::exchange(calls, {});
  }
};

class VllmEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    write_checkpoint(dir_.path() / "v1",
                     make_dense_checkpoint(
                         DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 3),
                     1);
    config_.receiver.model_family = "dense";
    const fs::path disk = required_env("FERRY_DISK_PLUGIN");
    const fs::path dense = required_env("FERRY_DENSE_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), dense.parent_path()});
    receiver_ = std::make_unique<receiver::Receiver>(config_, *registry_);
    receiver_->update_from_disk(dir_.path() / "v1", std::string("v1"));

    receiver::EngineCallbacks cb;
    cb.pause = [this](receiver::PauseMode mode) {
      log_.add(std::string("pause:") + receiver::pause_mode_name(mode));
      return std::uint64_t{3};
    };
    cb.resume = [this](bool) { log_.add("resume"); };
    cb.flush_cache = [this](bool) { log_.add("flush"); };
    cb.post_load = [this] { log_.add("post_load"); };
    cb.memory = [this](const std::vector<std::string>& tags, bool release) {
      if (log_.fail_memory) throw std::runtime_error("the KV cache pool is busy");
      for (const auto& t : tags) log_.add("memory:" + t + (release ? ":release" : ":resume"));
    };
    cb.memory_tags = {"kv_cache"};
    receiver_->engine_control().set_callbacks(std::move(cb));

    control::ServerOptions options;
    options.port = 0;
    server_ = std::make_unique<control::ControlServer>(*receiver_, options);
    server_->start();
  }
  void TearDown() override {
    server_->stop();
    server_.reset();
    receiver_.reset();
  }

  Reply call(const char* method, const std::string& path, const std::string& body = "") {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(30, 0);
    auto res = std::string(method) == "GET" ? client.Get(path.c_str())
                                            : client.Post(path.c_str(), body, "application/json");
    Reply r;
    if (!res) return r;
    r.status = res->status;
    r.text = res->body;
    r.body = json::parse(r.text, nullptr, false);
    return r;
  }
  Reply post(const std::string& path, const std::string& body = "") {
    return call("POST", path, body);
  }
  bool weights_released() {
    for (const auto& t : receiver_->memory_state()) {
      if (t.tag == "weights") return t.released;
    }
    return false;
  }

  TempDir dir_;
  config::Config config_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<receiver::Receiver> receiver_;
  std::unique_ptr<control::ControlServer> server_;
  EngineLog log_;
};

using Calls = std::vector<std::string>;

TEST_F(VllmEngine, PauseModesReachTheEngineCallbacks) {
  ASSERT_EQ(post("/pause").status, 200);  // abort, clear_cache true
  EXPECT_EQ(log_.take(), (Calls{"pause:abort", "flush"}));
  ASSERT_EQ(post("/resume").status, 200);
  EXPECT_EQ(log_.take(), (Calls{"resume"}));
  ASSERT_EQ(post("/pause?mode=keep").status, 200);  // keep: the frozen requests keep their cache
  EXPECT_EQ(log_.take(), (Calls{"pause:in_place"}));
  ASSERT_EQ(post("/resume").status, 200);
  log_.take();
  ASSERT_EQ(post("/pause?mode=abort&clear_cache=false").status, 200);
  EXPECT_EQ(log_.take(), (Calls{"pause:abort"}));
  ASSERT_EQ(post("/resume").status, 200);
  log_.take();
  const Reply wait = post("/pause?mode=wait");
  EXPECT_EQ(wait.status, 501) << wait.text;
  EXPECT_NE(wait.body.value("message", "").find("mode 'wait'"), std::string::npos) << wait.text;
  EXPECT_TRUE(log_.take().empty());
  EXPECT_EQ(call("GET", "/is_paused").body, json({{"is_paused", false}}));
}

TEST_F(VllmEngine, SleepReleasesTheEngineMemoryAndTheLastWakeUpResumesGeneration) {
  ASSERT_EQ(post("/sleep?level=1").status, 200);
  // The engine stops, its KV cache goes, then ferry's weights (backed up in the host mirror).
  EXPECT_EQ(log_.take(), (Calls{"pause:abort", "flush", "memory:kv_cache:release"}));
  EXPECT_TRUE(weights_released());
  ASSERT_EQ(post("/wake_up?tags=weights").status, 200);
  EXPECT_TRUE(log_.take().empty());
  EXPECT_FALSE(weights_released());
  EXPECT_EQ(call("GET", "/is_paused").body["is_paused"], true);
  ASSERT_EQ(post("/wake_up?tags=kv_cache").status, 200);
  EXPECT_EQ(log_.take(), (Calls{"memory:kv_cache:resume", "resume"}));
  EXPECT_EQ(call("GET", "/is_sleeping").body["is_sleeping"], false);
  // Paused before the sleep: the wake-up leaves generation paused, as the client left it.
  ASSERT_EQ(post("/pause?mode=keep").status, 200);
  ASSERT_EQ(post("/sleep?level=2&mode=keep").status, 200);
  ASSERT_EQ(post("/wake_up").status, 200);
  EXPECT_EQ(log_.take(), (Calls{"pause:in_place", "pause:in_place", "memory:kv_cache:release",
                                "memory:kv_cache:resume"}));
  EXPECT_EQ(call("GET", "/is_paused").body["is_paused"], true);
  ASSERT_EQ(post("/resume").status, 200);
}

TEST_F(VllmEngine, ASleepThatFailsResumesGenerationAndKeepsTheWeights) {
  log_.fail_memory = true;
  const Reply r = post("/sleep?level=1");
  EXPECT_EQ(r.status, 500) << r.text;
  EXPECT_NE(r.body.value("message", "").find("the KV cache pool is busy"), std::string::npos)
      << r.text;
  EXPECT_EQ(log_.take(), (Calls{"pause:abort", "flush", "resume"}));
  EXPECT_FALSE(weights_released());
  EXPECT_EQ(call("GET", "/is_sleeping").body["is_sleeping"], false);
  EXPECT_EQ(call("GET", "/is_paused").body["is_paused"], false);
}

TEST_F(VllmEngine, FinishWeightUpdateRunsThePostLoadProcessingOnce) {
  ASSERT_EQ(post("/start_weight_update").status, 200);
  const std::string body = R"({"model_path": ")" + (dir_.path() / "v1").string() + R"("})";
  ASSERT_EQ(post("/update_weights_from_disk", body).status, 200);
  EXPECT_EQ(log_.take(), (Calls{"flush"}));  // the disk route's flush_cache; post_load waits
  ASSERT_EQ(post("/finish_weight_update", R"({"weight_version": "step-1"})").status, 200);
  EXPECT_EQ(log_.take(), (Calls{"post_load"}));
  EXPECT_EQ(receiver_->version().label, "step-1");
}

}  // namespace
}  // namespace ferry::test
