// tests/nccl/two_rank_test.cpp: a trainer (this process: NcclTrainerGroup, rank 0, GPU 0) and a
// real `ferry serve` receiver (rank 1, GPU 1, identity model, weights on cuda:1) in one NCCL
// weight-update group, driven through the HTTP endpoints as SGLang's callers do: 50 consecutive
// updates arrive bit-identical (fingerprints of every parameter equal the trainer's); a receiver
// killed mid-update makes the trainer fail naming rank 1; a trainer that gives up mid-update makes
// the receiver fail with its version unchanged, and both recover by re-initialising the group.
// Exits 77 (meson's skip code) with fewer than two GPUs: NCCL refuses two ranks on one GPU.
#include <cuda_runtime.h>
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "registry/registry.hpp"
#include "serve_fixture.hpp"
#include "session/nccl_group.hpp"

namespace ferry::session {
namespace {

using namespace std::chrono_literals;
using test::Reply;
using test::ServeOptions;
using test::ServeProcess;

std::uint16_t g_next_port = 29611;

// A small dense-shaped model on GPU 0, refilled with a different pattern per update.
struct TrainerModel {
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::vector<std::uint8_t> host;  // the bytes last uploaded
    void* device = nullptr;
  };
  std::vector<Tensor> tensors;

  TrainerModel() {
    auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
      tensors.push_back(Tensor{std::move(name), std::move(shape), {}, nullptr});
    };
    add("model.embed_tokens.weight", {8192, 512});
    for (int l = 0; l < 4; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "self_attn.qkv_proj.weight", {1536, 512});
      add(p + "self_attn.o_proj.weight", {512, 512});
      add(p + "mlp.gate_up_proj.weight", {2816, 512});
      add(p + "mlp.down_proj.weight", {512, 1408});
      add(p + "input_layernorm.weight", {512});
    }
    add("lm_head.weight", {8192, 512});
    for (auto& t : tensors) {
      std::uint64_t n = 2;  // bf16
      for (auto d : t.shape) n *= d;
      t.host.resize(n);
      EXPECT_EQ(cudaMalloc(&t.device, n), cudaSuccess);
    }
  }
  ~TrainerModel() {
    for (auto& t : tensors) cudaFree(t.device);
  }

  void fill(unsigned step) {
    std::uint32_t x = step * 2654435761u + 17;
    for (auto& t : tensors) {
      for (auto& b : t.host) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::uint8_t>(x >> 24);
      }
      EXPECT_EQ(cudaMemcpy(t.device, t.host.data(), t.host.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }

  std::vector<TensorView> views() const {
    std::vector<TensorView> out;
    for (const auto& t : tensors) {
      out.push_back(TensorView{t.name, FERRY_DTYPE_BF16, t.shape, t.device, FERRY_MEMORY_CUDA, 0});
    }
    return out;
  }
};

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

class TwoRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = make_registry();
    ServeOptions o;
    o.model_family = "identity";
    o.layout = "hf";
    o.sets = {"receiver.device=cuda:1"};
    serve_ = std::make_unique<ServeProcess>(o);
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
    o.master_address = "127.0.0.1";
    o.master_port = port_;
    o.world_size = 2;
    o.group_name = "g";
    o.device = 0;
    o.init_timeout = 60s;
    o.bucket_bytes = 4u << 20;  // several buckets per update: double buffering is exercised
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

  void expect_receiver_holds_the_model() {
    const auto prints = serve_->fingerprints();
    ASSERT_EQ(prints.size(), model_.tensors.size());
    for (const auto& t : model_.tensors) {
      const auto expected = fmt::format("{:016x}", kernels::fingerprint_cpu(t.host.data(), t.host.size()));
      EXPECT_EQ(prints.at(t.name), expected) << t.name;
    }
  }

  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<ServeProcess> serve_;
  std::uint16_t port_ = 0;
  TrainerModel model_;
};

TEST_F(TwoRanks, FiftyConsecutiveUpdatesArriveBitIdentical) {
  auto group = init_group();
  for (unsigned step = 1; step <= 50; ++step) {
    SCOPED_TRACE(step);
    model_.fill(step);
    std::string trainer_error;
    const Reply r = update(*group, "step-" + std::to_string(step), &trainer_error);
    ASSERT_EQ(r.status, 200) << r.text << serve_->log();
    ASSERT_EQ(trainer_error, "");
    EXPECT_EQ(r.body.value("weight_version", ""), "step-" + std::to_string(step));
    if (step == 1 || step % 10 == 0) expect_receiver_holds_the_model();
  }
  EXPECT_EQ(serve_->get("/health").status, 200);
  EXPECT_EQ(serve_->post("/destroy_weights_update_group", {{"group_name", "g"}}).status, 200);
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
}

TEST_F(TwoRanks, TrainerGivingUpMidUpdateLeavesTheVersionAndBothRecover) {
  auto group = init_group();
  model_.fill(1);
  ASSERT_EQ(update(*group, "one", nullptr).status, 200);
  expect_receiver_holds_the_model();
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

  // Recovery: re-init on both sides (the receiver destroys its stale communicator first).
  group.reset();
  port_ = g_next_port;
  g_next_port += 2;
  group = init_group();
  const Reply again = update(*group, "three", nullptr);
  ASSERT_EQ(again.status, 200) << again.text << serve_->log();
  expect_receiver_holds_the_model();
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
