// The checkpoint-engine worker loop (ZmqWorker) against a real ZMQ REQ peer that sends the
// ParameterServer's messages: the real fixtures and hand-made pickles. Only the CUDA IPC open is
// replaced (HostBufferOpener), since this machine has no GPU.
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "fake_parameter_server.hpp"

namespace ferry::ckpt_engine {
namespace {

using testing::FakeParameterServer;
using testing::HostBufferOpener;
using testing::TensorMeta;
using testing::bucket_message;
using testing::fixture;
using testing::ipc_handle_message;
using testing::none_message;

constexpr std::uint64_t kBufferBytes = 8u << 20;

struct Received {
  std::vector<std::vector<std::byte>> data;
  std::vector<manifest::Manifest> manifests;
};

struct WorkerRun {
  std::vector<std::byte> buffer = std::vector<std::byte>(kBufferBytes);
  HostBufferOpener* opener = nullptr;
  std::unique_ptr<ZmqWorker> worker;

  WorkerRun(const std::string& address, ZmqWorkerOptions options = {}) {
    auto o = std::make_unique<HostBufferOpener>(buffer);
    opener = o.get();
    worker = std::make_unique<ZmqWorker>(address, std::move(o), options);
  }

  // The host side of one update: every bucket copied off and decoded; conclude() at the end.
  Received run_all() {
    Received out;
    worker->open_buffer();
    std::vector<std::byte> staging(kBufferBytes / 2);
    while (auto b = worker->next_bucket(staging.data(), staging.size())) {
      out.data.emplace_back(staging.begin(), staging.begin() + static_cast<std::ptrdiff_t>(b->bytes));
      out.manifests.push_back(manifest::decode(b->manifest));
    }
    worker->conclude();
    return out;
  }
};

void fill(std::vector<std::byte>& buffer, std::uint64_t offset, std::uint64_t bytes, int seed) {
  for (std::uint64_t i = 0; i < bytes; ++i) {
    buffer[offset + i] = static_cast<std::byte>((i * 31 + static_cast<std::uint64_t>(seed)) & 0xff);
  }
}

std::string error_of(const std::function<void()>& body, ferry_status_code_t* code = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(CkptEngineWorker, AnswersEveryMessageOfAFullUpdateAndCopiesEachBucket) {
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] { return run.run_all(); });

  const std::uint64_t half = kBufferBytes / 2;
  ps.send(ipc_handle_message(kBufferBytes));
  // Bucket 0 in half 0: a bf16 [4, 64] and an f32 [10] at the next 256-byte boundary.
  fill(run.buffer, 0, 512 + 40, 1);
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));  // the handle
  ps.send(bucket_message({{"a.weight", "bfloat16", {4, 64}, 0}, {"b.bias", "float32", {10}, 512}}));
  // Bucket 1 in half 1 (offsets are into the whole buffer).
  fill(run.buffer, half, 96, 2);
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"c.weight", "float16", {6, 8}, static_cast<std::int64_t>(half)}}));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(none_message());  // release
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  EXPECT_EQ(run.opener->closed, 1);
  ps.send(none_message());  // post-process
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));

  const Received got = host.get();
  ASSERT_EQ(got.manifests.size(), 2u);
  EXPECT_EQ(got.manifests[0].tensors.size(), 2u);
  EXPECT_EQ(got.manifests[0].tensors[1].name, "b.bias");
  EXPECT_EQ(got.manifests[0].tensors[1].offset, 512u);
  EXPECT_EQ(got.manifests[0].tensors[1].size, 40u);
  EXPECT_EQ(got.manifests[0].bucket_bytes, 552u);
  EXPECT_EQ(got.manifests[1].tensors[0].offset, 0u);  // rebased to the bucket
  EXPECT_EQ(got.manifests[1].tensors[0].dtype, FERRY_DTYPE_F16);
  EXPECT_EQ(got.manifests[1].bucket_index, 1u);
  ASSERT_EQ(got.data[0].size(), 552u);
  EXPECT_TRUE(std::equal(got.data[0].begin(), got.data[0].end(), run.buffer.begin()));
  ASSERT_EQ(got.data[1].size(), 96u);
  EXPECT_TRUE(std::equal(got.data[1].begin(), got.data[1].end(),
                         run.buffer.begin() + static_cast<std::ptrdiff_t>(half)));
  EXPECT_EQ(run.opener->opened, 1);
}

TEST(CkptEngineWorker, RealFixtureMessagesTravelTheSocket) {
  // The package's own bucket list (7 tensors, offsets up to ~1.2 MB) and its None.
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] { return run.run_all(); });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(fixture("bucket_dense_p4"));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(fixture("end"));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(fixture("end"));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  const Received got = host.get();
  ASSERT_EQ(got.manifests.size(), 1u);
  EXPECT_EQ(got.manifests[0].tensors.size(), 7u);
  EXPECT_EQ(got.manifests[0].tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(got.manifests[0].tensors[0].dtype, FERRY_DTYPE_BF16);
}

TEST(CkptEngineWorker, RealTorchHandleFromTheH200IsDecoded) {
  // fixtures/ipc_handle_torch211_cuda.pickle: pickle.dumps(reduce_tensor(torch.empty(1 << 20,
  // dtype=torch.uint8, device="cuda")), protocol=4) on the lent H200 (torch 2.11.0+cu130), saved
  // by tests/ckpt_engine/gpu/ckpt_engine_gpu.py.
  const Message m = decode_message(fixture("ipc_handle_torch211_cuda"));
  const auto* h = std::get_if<IpcBufferHandle>(&m);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->buffer_bytes(), 1u << 20);
  EXPECT_EQ(h->handle_format, CudaHandleFormat::cuda_malloc);
  EXPECT_EQ(h->handle_version, 2);
  EXPECT_EQ(h->dtype, FERRY_DTYPE_U8);
  EXPECT_EQ(h->storage_class, "torch.storage.TypedStorage");
  EXPECT_TRUE(h->ref_counter_handle.starts_with("/torch_")) << h->ref_counter_handle;
}

TEST(CkptEngineWorker, HostileMessageGetsAnErrorAnswerAndNoCrash) {
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] {
    ferry_status_code_t code = FERRY_STATUS_OK;
    std::string what = error_of([&] { run.run_all(); }, &code);
    return std::make_pair(code, what);
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  // os.system("echo pwned") by REDUCE: refused by name, never run.
  testing::PickleBytes evil;
  evil.global("os", "system").str("echo pwned").op(0x85).reduce().stop();
  ps.send(evil.bytes());
  const auto answer = ps.answer();
  ASSERT_TRUE(answer.has_value());
  EXPECT_NE(answer->find("os.system"), std::string::npos) << *answer;
  ps.send(fixture("abort"));  // what the ParameterServer sends after an error answer
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_CORRUPT_DATA) << what;
  EXPECT_NE(what.find("os.system"), std::string::npos) << what;
}

TEST(CkptEngineWorker, SilentServerHitsTheReceiveDeadline) {
  FakeParameterServer ps;  // binds, never sends
  ZmqWorkerOptions options;
  options.receive_timeout = std::chrono::milliseconds(300);
  WorkerRun run(ps.address(), options);
  ferry_status_code_t code = FERRY_STATUS_OK;
  const std::string what = error_of([&] { run.worker->open_buffer(); }, &code);
  EXPECT_EQ(code, FERRY_STATUS_TIMEOUT);
  EXPECT_NE(what.find("the IPC handle"), std::string::npos) << what;
  EXPECT_NE(what.find(ps.address()), std::string::npos) << what;
}

TEST(CkptEngineWorker, ServerThatGoesAwayMidUpdateFailsTheWaitNamingThePhase) {
  auto ps = std::make_unique<FakeParameterServer>();
  const std::string address = ps->address();
  // A deadline far beyond the test: the failure must come from the disconnect.
  ZmqWorkerOptions options;
  options.receive_timeout = std::chrono::seconds(600);
  WorkerRun run(address, options);
  auto host = std::async(std::launch::async, [&] {
    ferry_status_code_t code = FERRY_STATUS_OK;
    std::string what = error_of([&] { run.run_all(); }, &code);
    return std::make_pair(code, what);
  });
  ps->send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps->answer(), std::optional<std::string>(""));
  ps->send(bucket_message({{"a", "float32", {4}, 0}}));
  EXPECT_EQ(ps->answer(), std::optional<std::string>(""));
  ps.reset();  // the server's socket closes while the worker waits for bucket 1
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_PEER_FAILED) << what;
  EXPECT_NE(what.find("bucket 1"), std::string::npos) << what;
}

TEST(CkptEngineWorker, SenderAbortEndsTheUpdateWithItsMessage) {
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] {
    ferry_status_code_t code = FERRY_STATUS_OK;
    std::string what = error_of([&] { run.run_all(); }, &code);
    return std::make_pair(code, what);
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(fixture("abort"));
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_ABORTED);
  EXPECT_NE(what.find("Some workers failed to update weights"), std::string::npos) << what;
}

TEST(CkptEngineWorker, AbandonWhileApplyingABucketAnswersItWithTheReason) {
  FakeParameterServer ps;
  ZmqWorkerOptions options;
  options.abort_grace = std::chrono::milliseconds(200);  // this server sends nothing more
  WorkerRun run(ps.address(), options);
  std::promise<void> bucket_in;
  std::promise<void> abandoned;
  auto host = std::async(std::launch::async, [&] {
    run.worker->open_buffer();
    std::vector<std::byte> staging(kBufferBytes / 2);
    (void)run.worker->next_bucket(staging.data(), staging.size());
    bucket_in.set_value();
    abandoned.get_future().wait();  // still applying bucket 0 when the host gives up
    ferry_status_code_t code = FERRY_STATUS_OK;
    std::string what = error_of([&] { (void)run.worker->next_bucket(staging.data(), staging.size()); },
                                &code);
    run.worker->conclude();
    return std::make_pair(code, what);
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"a", "float32", {4}, 0}}));
  bucket_in.get_future().wait();
  // The worker owes the answer to bucket 0: the sender gets the reason instead of success.
  run.worker->abandon("applying bucket 0 failed: disk full");
  abandoned.set_value();
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_ABORTED);
  EXPECT_NE(what.find("disk full"), std::string::npos) << what;
  const auto answer = ps.answer();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(*answer, "applying bucket 0 failed: disk full");
}

TEST(CkptEngineWorker, AbandonWakesABlockedReceive) {
  FakeParameterServer ps;
  ZmqWorkerOptions options;
  options.abort_grace = std::chrono::milliseconds(200);  // this server sends nothing more
  WorkerRun run(ps.address(), options);
  auto host = std::async(std::launch::async, [&] {
    run.worker->open_buffer();
    std::vector<std::byte> staging(kBufferBytes / 2);
    (void)run.worker->next_bucket(staging.data(), staging.size());
    ferry_status_code_t code = FERRY_STATUS_OK;
    // Answers bucket 0 with success, then waits for a message that never comes.
    std::string what = error_of([&] { (void)run.worker->next_bucket(staging.data(), staging.size()); },
                                &code);
    run.worker->conclude();
    return std::make_pair(code, what);
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"a", "float32", {4}, 0}}));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));  // the host has moved on to bucket 1
  run.worker->abandon("the update was cancelled");
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_ABORTED);
  EXPECT_NE(what.find("cancelled"), std::string::npos) << what;
}

TEST(CkptEngineWorker, BucketLargerThanTheStagingIsRefusedWithAnAnswer) {
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] {
    run.worker->open_buffer();
    std::vector<std::byte> staging(64);
    ferry_status_code_t code = FERRY_STATUS_OK;
    std::string what = error_of([&] { (void)run.worker->next_bucket(staging.data(), staging.size()); },
                                &code);
    return std::make_pair(code, what);
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"big", "float32", {1000}, 0}}));
  const auto answer = ps.answer();
  ASSERT_TRUE(answer.has_value());
  EXPECT_NE(answer->find("4000 bytes"), std::string::npos) << *answer;
  ps.send(fixture("abort"));
  const auto [code, what] = host.get();
  EXPECT_EQ(code, FERRY_STATUS_INVALID_ARGUMENT) << what;
}

TEST(CkptEngineWorker, ClosingBeforeTheEndSignalAnswersWithAnError) {
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] {
    run.worker->open_buffer();
    std::vector<std::byte> staging(kBufferBytes / 2);
    (void)run.worker->next_bucket(staging.data(), staging.size());
    run.worker->conclude();  // no abandon(): still not a success
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"a", "float32", {4}, 0}}));
  const auto answer = ps.answer();
  ASSERT_TRUE(answer.has_value());
  EXPECT_NE(answer->find("before the sender's end signal"), std::string::npos) << *answer;
  ps.send(fixture("abort"));
  host.get();
}

TEST(CkptEngineWorker, ErrorAfterTheLastBucketIsRepeatedForBothNoneMessages) {
  // checkpoint-engine does not check the answer to its last bucket and sends None twice, each
  // waiting for an answer: a failing worker must answer both (with the error) so it never hangs.
  FakeParameterServer ps;
  WorkerRun run(ps.address());
  auto host = std::async(std::launch::async, [&] {
    run.worker->open_buffer();
    std::vector<std::byte> staging(kBufferBytes / 2);
    (void)run.worker->next_bucket(staging.data(), staging.size());
    run.worker->abandon("commit failed: fingerprint mismatch");
    run.worker->conclude();
  });
  ps.send(ipc_handle_message(kBufferBytes));
  EXPECT_EQ(ps.answer(), std::optional<std::string>(""));
  ps.send(bucket_message({{"a", "float32", {4}, 0}}));
  EXPECT_EQ(ps.answer(), std::optional<std::string>("commit failed: fingerprint mismatch"));
  ps.send(none_message());
  EXPECT_EQ(ps.answer(), std::optional<std::string>("commit failed: fingerprint mismatch"));
  ps.send(none_message());
  EXPECT_EQ(ps.answer(), std::optional<std::string>("commit failed: fingerprint mismatch"));
  host.get();
}

}  // namespace
}  // namespace ferry::ckpt_engine
