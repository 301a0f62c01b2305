// tests/nccl/two_rank_test.cpp: a trainer (rank 0, GPU 0) and a real `ferry serve` receiver
// (rank 1, GPU 1, identity model, weights on cuda:1) in one NCCL weight-update group, driven
// through the HTTP endpoints as SGLang's callers do:
//  - 50 consecutive updates arrive bit-identical (fingerprints of every parameter equal the
//    trainer's), then both sides destroy the group at once and finalize it;
//  - a one-sided destroy of the receiver answers within its timeout (aborted locally), and the
//    trainer's next broadcast names rank 1;
//  - a receiver killed mid-update makes the trainer fail naming rank 1;
//  - a trainer that gives up mid-update makes the receiver fail with its version unchanged, and
//    both recover by re-initialising the group;
//  - a trainer *process* (nccl_trainer_peer) SIGKILLed mid-update: the receiver fails naming
//    rank 0, its version and fingerprints unchanged, then accepts a fresh init and update.
// The trainer is this process (NcclTrainerGroup) except in the last case. With FERRY_NCCL_LOG_DIR
// set, every receiver's log is written there as <test>.serve.log. Exits 77 (meson's skip code)
// with fewer than two GPUs: NCCL refuses two ranks on one GPU.
#include <cuda_runtime.h>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "registry/registry.hpp"
#include "serve_fixture.hpp"
#include "group/trainer_group.hpp"
#include "trainer_model.hpp"

namespace ferry::session {
namespace {

using namespace std::chrono_literals;
using test::Reply;
using test::ServeOptions;
using test::ServeProcess;
using test::TrainerModel;

constexpr std::uint64_t kBucketBytes = 4u << 20;  // several buckets: double buffering exercised
std::uint16_t g_next_port = 29611;

std::unique_ptr<registry::Registry> make_registry() {
  std::vector<std::filesystem::path> dirs;
  const char* env = std::getenv("FERRY_TEST_PLUGIN_DIRS");
  for (std::string rest = env ? env : ""; !rest.empty();) {
    const auto colon = rest.find(':');
    dirs.emplace_back(rest.substr(0, colon));
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
  }
  return std::make_unique<registry::Registry>(dirs);
}

// The trainer process: nccl_trainer_peer next to this test (or FERRY_NCCL_TRAINER_PEER), with a
// pipe each way (see trainer_peer.cpp for the protocol).
class TrainerProcess {
 public:
  explicit TrainerProcess(std::uint16_t port) {
    std::string exe;
    if (const char* env = std::getenv("FERRY_NCCL_TRAINER_PEER")) {
      exe = env;
    } else {
      exe = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "nccl_trainer_peer")
                .string();
    }
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      const std::string p = std::to_string(port), b = std::to_string(kBucketBytes);
      ::execl(exe.c_str(), exe.c_str(), p.c_str(), b.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "cannot exec %s\n", exe.c_str());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  ~TrainerProcess() {
    kill();
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
  }

  void send(const std::string& line) {
    std::fputs((line + "\n").c_str(), in_);
    std::fflush(in_);
  }
  // The next line (without the newline); "" when the process closed its output.
  std::string line() {
    std::string text;
    int c = 0;
    while ((c = std::fgetc(out_)) != EOF && c != '\n') text.push_back(static_cast<char>(c));
    return text;
  }
  // Lines until one starts with `prefix` (returned whole); "" at end of output.
  std::string expect(const std::string& prefix) {
    for (std::string l = line(); !l.empty() || !std::feof(out_); l = line()) {
      if (l.rfind(prefix, 0) == 0) return l;
    }
    return "";
  }
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

class TwoRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = make_registry();
    ServeOptions o;
    o.model_family = "identity";
    o.layout = "hf";
    o.sets = {"receiver.device=cuda:1"};
    serve_ = std::make_unique<ServeProcess>(o);
    next_port();
  }
  void TearDown() override {
    if (const char* dir = std::getenv("FERRY_NCCL_LOG_DIR"); dir != nullptr && serve_) {
      const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
      std::ofstream(std::string(dir) + "/" + info->name() + ".serve.log") << serve_->log();
    }
  }
  void next_port() {
    port_ = g_next_port;
    g_next_port += 2;
  }

  nlohmann::json init_body() const {
    return nlohmann::json{{"master_address", "127.0.0.1"}, {"master_port", port_},
                          {"rank_offset", 1},              {"world_size", 2},
                          {"group_name", "g"},             {"backend", "nccl"},
                          {"timeout_s", 60}};
  }

  // Both sides of init at once: the receiver's POST blocks until rank 0 served the id.
  std::unique_ptr<NcclTrainerGroup> init_group() {
    auto joined = std::async(std::launch::async,
                             [&] { return serve_->post("/init_weights_update_group", init_body()); });
    NcclTrainerOptions o;
    o.transport = "nccl";
    o.master_address = "127.0.0.1";
    o.master_port = port_;
    o.world_size = 2;
    o.group_name = "g";
    o.device = 0;
    o.init_timeout = 60s;
    o.bucket_bytes = kBucketBytes;
    o.bucket_timeout = 30s;
    auto group = std::make_unique<NcclTrainerGroup>(*registry_, o);
    const Reply r = joined.get();
    EXPECT_EQ(r.status, 200) << r.text << serve_->log();
    return group;
  }

  // One update: the receiver's POST and the trainer's broadcast at once.
  Reply update(NcclTrainerGroup& group, const std::string& label, std::string* trainer_error) {
    const auto views = model_.views();
    const auto body = nlohmann::json::parse(group.update_request(views, label));
    auto received = std::async(std::launch::async,
                               [&] { return serve_->post("/update_weights_from_distributed", body); });
    try {
      group.broadcast(views);
    } catch (const Error& e) {
      if (trainer_error) *trainer_error = e.what();
    }
    return received.get();
  }

  // Both sides destroy at once, as SGLang's trainer does: the leave handshake agrees, both
  // finalize.
  void destroy_together(std::unique_ptr<NcclTrainerGroup>& group) {
    auto destroyed = std::async(std::launch::async, [&] {
      return serve_->post("/destroy_weights_update_group", {{"group_name", "g"}, {"timeout_s", 30}});
    });
    const std::string trainer_how = group->close(30s);
    const Reply r = destroyed.get();
    ASSERT_EQ(r.status, 200) << r.text << serve_->log();
    EXPECT_EQ(r.body.value("teardown", ""), "finalized") << r.text;
    EXPECT_EQ(trainer_how, "finalized");
    group.reset();
  }

  void expect_receiver_holds(const std::map<std::string, std::string>& expected) {
    const auto prints = serve_->fingerprints();
    ASSERT_EQ(prints.size(), expected.size());
    for (const auto& [name, print] : expected) EXPECT_EQ(prints.at(name), print) << name;
  }

  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<ServeProcess> serve_;
  std::uint16_t port_ = 0;
  TrainerModel model_{0};
};

TEST_F(TwoRanks, FiftyConsecutiveUpdatesArriveBitIdenticalAndBothSidesFinalize) {
  auto group = init_group();
  for (unsigned step = 1; step <= 50; ++step) {
    SCOPED_TRACE(step);
    model_.fill(step);
    std::string trainer_error;
    const Reply r = update(*group, "step-" + std::to_string(step), &trainer_error);
    ASSERT_EQ(r.status, 200) << r.text << serve_->log();
    ASSERT_EQ(trainer_error, "");
    EXPECT_EQ(r.body.value("weight_version", ""), "step-" + std::to_string(step));
    if (step == 1 || step % 10 == 0) expect_receiver_holds(model_.fingerprints());
  }
  EXPECT_EQ(serve_->get("/health").status, 200);
  destroy_together(group);
  // The name is free again: a new group of that name joins.
  next_port();
  group = init_group();
  model_.fill(51);
  ASSERT_EQ(update(*group, "step-51", nullptr).status, 200);
  expect_receiver_holds(model_.fingerprints());
  destroy_together(group);
}

TEST_F(TwoRanks, OneSidedDestroyAnswersWithinItsTimeoutAndTheTrainerNamesRankOne) {
  auto group = init_group();
  model_.fill(1);
  ASSERT_EQ(update(*group, "one", nullptr).status, 200);
  // Only the receiver destroys: no agreement within the leave window, so it aborts locally. The
  // client waits up to 120 s; the handler's own bound is the request's timeout_s.
  const Reply r = serve_->post("/destroy_weights_update_group",
                               {{"group_name", "g"}, {"timeout_s", 10}});
  ASSERT_EQ(r.status, 200) << r.text << serve_->log();
  EXPECT_EQ(r.body.value("teardown", ""), "aborted") << r.text;
  model_.fill(2);
  try {
    group->broadcast(model_.views());
    FAIL() << "a broadcast to a receiver that left succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(group->close(10s), "aborted");
  EXPECT_EQ(serve_->get("/get_weight_version").body.value("weight_version", ""), "one");
}

TEST_F(TwoRanks, ReceiverKilledMidUpdateMakesTheTrainerFailNamingRankOne) {
  auto group = init_group();
  model_.fill(1);
  ASSERT_EQ(update(*group, "one", nullptr).status, 200);
  model_.fill(2);
  const auto views = model_.views();
  const auto body = nlohmann::json::parse(group->update_request(views, "two"));
  auto received = std::async(std::launch::async,
                             [&] { return serve_->post("/update_weights_from_distributed", body); });
  std::this_thread::sleep_for(1s);  // the receiver is waiting for bucket 0
  kill(serve_->pid(), SIGKILL);
  try {
    group->broadcast(views);
    FAIL() << "the broadcast to a killed receiver succeeded";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == FERRY_STATUS_PEER_FAILED || e.code() == FERRY_STATUS_TIMEOUT)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(group->failed());
  received.get();
  EXPECT_EQ(group->close(10s), "aborted");
}

TEST_F(TwoRanks, TrainerGivingUpMidUpdateLeavesTheVersionAndBothRecover) {
  auto group = init_group();
  model_.fill(1);
  ASSERT_EQ(update(*group, "one", nullptr).status, 200);
  const auto one = model_.fingerprints();
  expect_receiver_holds(one);
  model_.fill(2);
  const auto views = model_.views();
  const auto body = nlohmann::json::parse(group->update_request(views, "two"));
  auto received = std::async(std::launch::async,
                             [&] { return serve_->post("/update_weights_from_distributed", body); });
  std::this_thread::sleep_for(1s);
  group->abort("test: the trainer gives up");  // communicator aborted, links shut down
  const Reply r = received.get();
  EXPECT_NE(r.status, 200) << r.text;
  EXPECT_NE(r.body.value("message", "").find("rank 0"), std::string::npos) << r.text;
  EXPECT_EQ(serve_->get("/get_weight_version").body.value("weight_version", ""), "one");
  expect_receiver_holds(one);

  // Recovery: re-init on both sides (the receiver destroys its stale communicator first).
  EXPECT_EQ(group->close(10s), "aborted");
  group.reset();
  next_port();
  group = init_group();
  model_.fill(3);
  const Reply again = update(*group, "three", nullptr);
  ASSERT_EQ(again.status, 200) << again.text << serve_->log();
  expect_receiver_holds(model_.fingerprints());
  destroy_together(group);
}

TEST_F(TwoRanks, TrainerProcessKilledMidUpdateLeavesTheReceiverIntactAndReady) {
  auto trainer = std::make_unique<TrainerProcess>(port_);
  {
    const Reply joined = serve_->post("/init_weights_update_group", init_body());
    ASSERT_EQ(joined.status, 200) << joined.text << serve_->log();
    ASSERT_EQ(trainer->expect("READY"), "READY");
  }
  auto run_update = [&](const std::string& command) {
    trainer->send(command);
    const std::string request = trainer->expect("REQUEST ");
    EXPECT_FALSE(request.empty()) << command;
    const auto body = nlohmann::json::parse(request.substr(8));
    return std::async(std::launch::async,
                      [this, body] { return serve_->post("/update_weights_from_distributed", body); });
  };
  ASSERT_EQ(run_update("update 1 one").get().status, 200) << serve_->log();
  EXPECT_EQ(trainer->expect("DONE"), "DONE ok");
  model_.fill_host(1);
  const auto one = model_.fingerprints();
  expect_receiver_holds(one);

  // Update two: the trainer sends 2 buckets of many, then its process is killed.
  auto received = run_update("stall 2 two 2");
  ASSERT_EQ(trainer->expect("STALLED"), "STALLED");
  trainer->kill();
  const Reply r = received.get();
  EXPECT_NE(r.status, 200) << r.text;
  EXPECT_NE(r.body.value("message", "").find("rank 0"), std::string::npos) << r.text;
  EXPECT_EQ(serve_->get("/get_weight_version").body.value("weight_version", ""), "one");
  expect_receiver_holds(one);
  EXPECT_EQ(serve_->get("/health").status, 200);

  // A fresh trainer process: the receiver re-initialises (its failed group goes first).
  next_port();
  trainer = std::make_unique<TrainerProcess>(port_);
  {
    const Reply joined = serve_->post("/init_weights_update_group", init_body());
    ASSERT_EQ(joined.status, 200) << joined.text << serve_->log();
    ASSERT_EQ(trainer->expect("READY"), "READY");
  }
  ASSERT_EQ(run_update("update 3 three").get().status, 200) << serve_->log();
  EXPECT_EQ(trainer->expect("DONE"), "DONE ok");
  model_.fill_host(3);
  expect_receiver_holds(model_.fingerprints());
  EXPECT_EQ(serve_->get("/get_weight_version").body.value("weight_version", ""), "three");

  auto destroyed = std::async(std::launch::async, [&] {
    return serve_->post("/destroy_weights_update_group", {{"group_name", "g"}, {"timeout_s", 30}});
  });
  trainer->send("close");
  EXPECT_EQ(trainer->expect("CLOSED"), "CLOSED finalized");
  const Reply d = destroyed.get();
  EXPECT_EQ(d.status, 200) << d.text;
  EXPECT_EQ(d.body.value("teardown", ""), "finalized") << d.text;
}

}  // namespace
}  // namespace ferry::session

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    std::printf("nccl_two_rank: %d GPU(s): skipped (needs two GPUs, one rank each)\n", count);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
