// A checkpoint-engine update into the real receiver (ferry::receiver::Receiver with the disk and
// identity plugins, weights on the CPU): a fake ParameterServer on a real ZMQ socket sends the
// protocol's messages, the worker loop (ZmqWorker) receives them and apply_ckpt_engine_update
// applies them as one transaction. Only the CUDA IPC open is host memory (HostBufferOpener).
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <future>
#include <random>

#include "config/config.hpp"
#include "fake_parameter_server.hpp"
#include "receiver/receiver.hpp"
#include "receiver/receiver_ckpt.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace ferry::ckpt_engine {
namespace {

namespace fs = std::filesystem;
using receiver::Receiver;
using testing::FakeParameterServer;
using testing::HostBufferOpener;
using testing::TensorMeta;

constexpr std::uint64_t kHalf = 16u << 10;  // the fake server's bucket size

// The worker loop as the receiver's bucket source.
class WorkerSource final : public receiver::CkptBucketSource {
 public:
  explicit WorkerSource(std::unique_ptr<ZmqWorker> worker) : worker_(std::move(worker)) {}
  std::uint64_t open() override { return worker_->open_buffer(); }
  bool read(void* dst, std::uint64_t capacity, std::vector<std::uint8_t>& manifest,
            std::uint64_t& bytes) override {
    auto b = worker_->next_bucket(dst, capacity);
    if (!b) return false;
    manifest = std::move(b->manifest);
    bytes = b->bytes;
    return true;
  }
  void fail(const std::string& reason) noexcept override { worker_->abandon(reason); }
  void close() noexcept override {
    try {
      worker_->conclude();
    } catch (...) {
    }
  }

 private:
  std::unique_ptr<ZmqWorker> worker_;
};

const char* torch_dtype(ferry_dtype_t d) {
  switch (d) {
    case FERRY_DTYPE_BF16: return "bfloat16";
    case FERRY_DTYPE_F16: return "float16";
    case FERRY_DTYPE_F32: return "float32";
    default: return "?";
  }
}

test::Checkpoint make_checkpoint(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  test::Checkpoint c;
  const std::vector<std::tuple<std::string, ferry_dtype_t, std::vector<std::uint64_t>>> specs = {
      {"embed.weight", FERRY_DTYPE_BF16, {64, 32}}, {"norm.weight", FERRY_DTYPE_F32, {100}},
      {"proj.weight", FERRY_DTYPE_F16, {8, 8}},     {"head.weight", FERRY_DTYPE_BF16, {128, 16}},
      {"scale", FERRY_DTYPE_F32, {3}},               {"big.weight", FERRY_DTYPE_BF16, {64, 96}}};
  for (const auto& [name, dtype, shape] : specs) {
    test::Tensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = shape;
    t.bytes = test::random_elements(dtype, t.elements(), rng);
    c.tensors.push_back(std::move(t));
  }
  return c;
}

std::uint64_t align256(std::uint64_t n) { return (n + 255) / 256 * 256; }

// What checkpoint-engine's _update_per_bucket does, over `ps`: the handle, then per bucket
// (filled into half gidx % 2 of `buffer`, at most kHalf bytes) the answer to the previous message
// and the bucket's list, then two None. `stop_after` buckets: the server goes away instead.
// Returns every answer it read.
std::vector<std::string> serve_update(FakeParameterServer& ps, std::vector<std::byte>& buffer,
                                      const test::Checkpoint& c, int stop_after = -1) {
  std::vector<std::vector<const test::Tensor*>> buckets(1);
  std::uint64_t used = 0;
  for (const auto& t : c.tensors) {
    if (used + align256(t.bytes.size()) > kHalf) {
      buckets.emplace_back();
      used = 0;
    }
    buckets.back().push_back(&t);
    used += align256(t.bytes.size());
  }
  std::vector<std::string> answers;
  auto read_answer = [&] {
    auto a = ps.answer();
    answers.push_back(a.value_or("<no answer>"));
  };
  ps.send(testing::ipc_handle_message(2 * kHalf));
  for (std::size_t g = 0; g < buckets.size(); ++g) {
    std::uint64_t offset = (g % 2) * kHalf;
    std::vector<TensorMeta> metas;
    for (const auto* t : buckets[g]) {
      std::memcpy(buffer.data() + offset, t->bytes.data(), t->bytes.size());
      std::vector<std::int64_t> shape(t->shape.begin(), t->shape.end());
      metas.push_back({t->name, torch_dtype(t->dtype), shape, static_cast<std::int64_t>(offset)});
      offset += align256(t->bytes.size());
    }
    read_answer();
    if (answers.back() != "") {
      ps.send(testing::fixture("abort"));
      return answers;
    }
    if (static_cast<int>(g) == stop_after) {
      ps.close();
      return answers;
    }
    ps.send(testing::bucket_message(metas));
  }
  read_answer();
  ps.send(testing::none_message());
  read_answer();
  ps.send(testing::none_message());
  read_answer();
  return answers;
}

std::map<std::string, std::uint64_t> fingerprints_of(const test::Checkpoint& c) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& t : c.tensors) {
    out[t.name] = kernels::fingerprint_cpu(t.bytes.data(), t.bytes.size(), 1);
  }
  return out;
}

class CkptEngineReceiver : public ::testing::Test {
 protected:
  void SetUp() override {
    v1_ = make_checkpoint(1);
    v2_ = make_checkpoint(2);
    test::write_checkpoint(dir_.path() / "v1", v1_, 1);
    config_.receiver.model_family = "identity";
    const fs::path disk = test::required_env("FERRY_DISK_PLUGIN");
    const fs::path identity = test::required_env("FERRY_IDENTITY_PLUGIN");
    registry_ = std::make_unique<registry::Registry>(
        std::vector<fs::path>{disk.parent_path(), identity.parent_path()});
    receiver_ = std::make_unique<Receiver>(config_, *registry_);
  }

  void load_v1() {
    ASSERT_EQ(receiver_->update_from_disk(dir_.path() / "v1", "v1").version.number, 1u);
    ASSERT_EQ(receiver_->fingerprints(), fingerprints_of(v1_));
  }

  std::unique_ptr<WorkerSource> source_for(const FakeParameterServer& ps) {
    auto opener = std::make_unique<HostBufferOpener>(buffer_);
    return std::make_unique<WorkerSource>(
        std::make_unique<ZmqWorker>(ps.address(), std::move(opener), options_));
  }

  test::TempDir dir_;
  test::Checkpoint v1_, v2_;
  config::Config config_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<Receiver> receiver_;
  std::vector<std::byte> buffer_ = std::vector<std::byte>(2 * kHalf);
  ZmqWorkerOptions options_;
};

TEST_F(CkptEngineReceiver, UpdateFromTheParameterServerPublishesBitIdenticalWeights) {
  load_v1();
  FakeParameterServer ps;
  auto source = source_for(ps);
  auto server = std::async(std::launch::async, [&] { return serve_update(ps, buffer_, v2_); });
  const auto report = receiver::apply_ckpt_engine_update(*receiver_, *source, "step-2");
  const auto answers = server.get();
  EXPECT_EQ(report.version.number, 2u);
  EXPECT_EQ(report.tensors, v2_.tensors.size());
  EXPECT_GE(report.buckets, 2u);
  EXPECT_EQ(receiver_->version().label, "step-2");
  EXPECT_EQ(receiver_->fingerprints(), fingerprints_of(v2_));
  // Every message answered with success: handle, each bucket, release, post-process.
  for (const auto& a : answers) EXPECT_EQ(a, "");
  EXPECT_EQ(answers.size(), report.buckets + 3);
  const auto w = receiver_->weights_by_name("scale", 3);
  ASSERT_EQ(w.values.size(), 3u);
  float expected = 0;
  std::memcpy(&expected, v2_.at("scale").bytes.data(), 4);
  EXPECT_EQ(w.values[0], static_cast<double>(expected));
}

TEST_F(CkptEngineReceiver, ServerThatGoesAwayMidUpdateLeavesTheVersion) {
  load_v1();
  options_.receive_timeout = std::chrono::seconds(600);  // the disconnect must end it, not this
  FakeParameterServer ps;
  auto source = source_for(ps);
  auto server = std::async(std::launch::async, [&] { return serve_update(ps, buffer_, v2_, 1); });
  std::string message;
  ferry_status_code_t code = FERRY_STATUS_OK;
  try {
    receiver::apply_ckpt_engine_update(*receiver_, *source, "step-2");
    ADD_FAILURE() << "an update whose server went away was reported as a success";
  } catch (const Error& e) {
    message = e.what();
    code = e.code();
  }
  server.get();
  EXPECT_EQ(code, FERRY_STATUS_PEER_FAILED) << message;
  EXPECT_NE(message.find("receive bucket 1"), std::string::npos) << message;
  EXPECT_EQ(receiver_->version().number, 1u);
  EXPECT_EQ(receiver_->version().label, "v1");
}

TEST_F(CkptEngineReceiver, BucketNamingAnUnknownTensorFailsAndTheServerIsTold) {
  load_v1();
  test::Checkpoint wrong = v2_;
  wrong.tensors[1].name = "not.a.parameter";
  FakeParameterServer ps;
  auto source = source_for(ps);
  auto server = std::async(std::launch::async, [&] { return serve_update(ps, buffer_, wrong); });
  std::string message;
  try {
    receiver::apply_ckpt_engine_update(*receiver_, *source, "step-2");
    ADD_FAILURE() << "the bad update was reported as a success";
  } catch (const Error& e) {
    message = e.what();
  }
  const auto answers = server.get();
  EXPECT_NE(message.find("apply bucket 0"), std::string::npos) << message;
  EXPECT_NE(message.find("not.a.parameter"), std::string::npos) << message;
  ASSERT_GE(answers.size(), 2u);
  EXPECT_EQ(answers[0], "");  // the handle
  EXPECT_NE(answers[1].find("not.a.parameter"), std::string::npos) << answers[1];
  EXPECT_EQ(receiver_->version().number, 1u);
  EXPECT_EQ(receiver_->fingerprints(), fingerprints_of(v1_));
}

TEST_F(CkptEngineReceiver, ReceiverWithoutAModelRefusesAndTheServerIsTold) {
  FakeParameterServer ps;  // no update_from_disk: no layout
  auto source = source_for(ps);
  auto server = std::async(std::launch::async, [&] { return serve_update(ps, buffer_, v2_); });
  std::string message;
  try {
    receiver::apply_ckpt_engine_update(*receiver_, *source, std::nullopt);
    ADD_FAILURE() << "an update without a layout was reported as a success";
  } catch (const Error& e) {
    message = e.what();
  }
  const auto answers = server.get();
  EXPECT_NE(message.find("no model loaded"), std::string::npos) << message;
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_NE(answers[0].find("no model loaded"), std::string::npos) << answers[0];
  EXPECT_EQ(receiver_->version().number, 0u);
}

}  // namespace
}  // namespace ferry::ckpt_engine
