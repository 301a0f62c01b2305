// tests/ckpt_engine/messages_test.cpp: checkpoint-engine messages captured from the real package
// (fixtures/make_fixtures.py) decode to the expected structs; malformed messages and illegal
// sequences are refused; every truncation of every fixture is refused.
#include "ckpt_engine/messages.hpp"
#include "ckpt_engine/worker_session.hpp"
#include "pickle_bytes.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ferry::ckpt_engine {
namespace {

using testing::PickleBytes;
namespace fs = std::filesystem;

const fs::path kFixtures = FERRY_CKPT_FIXTURE_DIR;

std::vector<std::uint8_t> fixture(const std::string& name) {
  std::ifstream in(kFixtures / (name + ".pickle"), std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json expected() {
  std::ifstream in(kFixtures / "expected.json");
  return nlohmann::json::parse(in);
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// The CORRUPT_DATA message decode_message throws, or a failure when it accepts.
std::string refusal(const std::vector<std::uint8_t>& bytes) {
  try {
    (void)decode_message(bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the message was accepted";
  return {};
}

TEST(CkptEngineFixtures, EveryFixtureDecodesToItsExpectedMessage) {
  const auto all = expected();
  ASSERT_EQ(all["generator"]["checkpoint_engine"], "0.4.2");
  ASSERT_GE(all["fixtures"].size(), 7u);
  for (const auto& [name, want] : all["fixtures"].items()) {
    SCOPED_TRACE(name);
    const Message m = decode_message(fixture(name));
    const std::string kind = want["kind"];
    if (kind == "bucket") {
      const auto* bucket = std::get_if<BucketMeta>(&m);
      ASSERT_NE(bucket, nullptr);
      ASSERT_EQ(bucket->tensors.size(), want["tensors"].size());
      for (std::size_t i = 0; i < bucket->tensors.size(); ++i) {
        const auto& t = bucket->tensors[i];
        const auto& w = want["tensors"][i];
        EXPECT_EQ(t.name, w["name"].get<std::string>());
        EXPECT_EQ(t.dtype, dtype_from_name(w["dtype"].get<std::string>()).value());
        EXPECT_EQ(t.shape, w["shape"].get<std::vector<std::uint64_t>>());
        EXPECT_EQ(t.offset, w["offset"].get<std::uint64_t>());
        EXPECT_EQ(t.bytes, byte_size(t.dtype, t.shape).value());
      }
    } else if (kind == "ipc_handle") {
      const auto* h = std::get_if<IpcBufferHandle>(&m);
      ASSERT_NE(h, nullptr);
      EXPECT_EQ(h->buffer_bytes(), want["size"].get<std::uint64_t>());
      EXPECT_EQ(h->device, want["device"].get<std::int64_t>());
      EXPECT_EQ(hex(h->storage_handle), want["storage_handle_hex"].get<std::string>());
      EXPECT_EQ(h->storage_size_bytes, want["storage_size_bytes"].get<std::uint64_t>());
      EXPECT_EQ(h->storage_offset_bytes, want["storage_offset_bytes"].get<std::uint64_t>());
      EXPECT_EQ(h->tensor_offset, want["tensor_offset"].get<std::uint64_t>());
      EXPECT_EQ(h->ref_counter_handle, want["ref_counter_handle"].get<std::string>());
      EXPECT_EQ(h->ref_counter_offset, want["ref_counter_offset"].get<std::uint64_t>());
      ASSERT_TRUE(h->event_handle.has_value());
      EXPECT_EQ(hex(*h->event_handle), want["event_handle_hex"].get<std::string>());
      EXPECT_EQ(h->event_sync_required, want["event_sync_required"].get<bool>());
    } else if (kind == "end") {
      EXPECT_TRUE(std::holds_alternative<EndSignal>(m));
    } else if (kind == "abort") {
      const auto* a = std::get_if<AbortRequest>(&m);
      ASSERT_NE(a, nullptr);
      EXPECT_EQ(a->exception, want["exception"].get<std::string>());
      EXPECT_EQ(a->text, want["text"].get<std::string>());
    } else {
      ADD_FAILURE() << "unknown kind " << kind;
    }
  }
}

TEST(CkptEngineFixtures, IpcHandleCarriesTheCudaMallocHandleBytes) {
  const auto h = std::get<IpcBufferHandle>(decode_message(fixture("ipc_handle")));
  EXPECT_EQ(h.tensor_class, "torch.Tensor");
  EXPECT_EQ(h.storage_class, "torch.storage.TypedStorage");
  EXPECT_EQ(h.dtype, FERRY_DTYPE_U8);
  EXPECT_EQ(h.size, std::vector<std::uint64_t>{6ULL << 30});
  EXPECT_EQ(h.stride, std::vector<std::uint64_t>{1});
  EXPECT_EQ(h.handle_format, CudaHandleFormat::cuda_malloc);
  EXPECT_EQ(h.handle_version, 2);
  for (std::size_t i = 0; i < h.ipc_mem_handle.size(); ++i) EXPECT_EQ(h.ipc_mem_handle[i], i);
  EXPECT_FALSE(h.requires_grad);
  EXPECT_EQ(h.ref_counter_handle, "/torch_4242_3141592653_0");
}

TEST(CkptEngineFixtures, DenseBucketHasTheDtypesShapesAndAlignedOffsetsTheSenderUsed) {
  const auto b = std::get<BucketMeta>(decode_message(fixture("bucket_dense_p4")));
  ASSERT_EQ(b.tensors.size(), 7u);
  EXPECT_EQ(b.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(b.tensors[0].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(b.tensors[0].shape, (std::vector<std::uint64_t>{1024, 256}));
  EXPECT_EQ(b.tensors[1].offset, 1024u * 256 * 2);  // 256-byte aligned sizes, packed in order
  EXPECT_EQ(b.tensors[2].dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(b.tensors[4].dtype, FERRY_DTYPE_F16);
  EXPECT_EQ(b.tensors[5].dtype, FERRY_DTYPE_I64);
  EXPECT_TRUE(b.tensors[6].shape.empty());  // a scalar: torch.Size([])
  EXPECT_EQ(b.tensors[6].bytes, 4u);
  EXPECT_EQ(b.begin, 0u);
  // The same bucket in the odd half of the double buffer, as protocol 5 (Python 3.14 default).
  const auto odd = std::get<BucketMeta>(decode_message(fixture("bucket_dense_odd_p5")));
  EXPECT_EQ(odd.tensors[1].offset - odd.tensors[0].offset, b.tensors[1].offset);
  EXPECT_EQ(odd.begin, 3ULL << 30);
}

TEST(CkptEngineFixtures, MoeBucketOfThousandsOfExpertsDecodes) {
  const auto b = std::get<BucketMeta>(decode_message(fixture("bucket_moe_p4")));
  ASSERT_EQ(b.tensors.size(), 1536u);
  EXPECT_EQ(b.tensors.back().name, "model.layers.1.mlp.experts.255.down_proj.weight");
  EXPECT_EQ(b.end - b.begin, 1536ULL * 512 * 128 * 2);
}

TEST(CkptEngineFixtures, EveryTruncationOfEveryFixtureIsRefused) {
  const auto all = expected();  // kept alive: items() only views it
  ASSERT_GE(all["fixtures"].size(), 7u);
  for (const auto& [name, want] : all["fixtures"].items()) {
    const auto full = fixture(name);
    // The MoE fixture is large; every prefix of it would take O(n^2) here, so stride through it.
    const std::size_t stride = full.size() > 4096 ? 97 : 1;
    for (std::size_t len = 0; len < full.size(); len += stride) {
      const std::vector<std::uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      try {
        (void)decode_message(prefix);
        ADD_FAILURE() << name << " truncated to " << len << " bytes was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << name << " at " << len << ": " << e.what();
      }
    }
  }
}

TEST(CkptEngineFixtures, TrailingGarbageAfterARealMessageIsRefused) {
  auto bytes = fixture("bucket_dense_p4");
  bytes.push_back('N');
  const std::string message = refusal(bytes);
  EXPECT_NE(message.find("1 trailing bytes after STOP"), std::string::npos) << message;
}

// ---- the worker session over real fixtures ----------------------------------------------

TEST(CkptEngineSession, FullUpdateSequenceYieldsTheActionsOfCheckpointEngineWorker) {
  WorkerSession s;
  auto step = s.next(fixture("ipc_handle"));
  EXPECT_EQ(step.action, WorkerAction::map_buffer);
  EXPECT_EQ(s.buffer_bytes(), 6ULL << 30);
  for (const char* name : {"bucket_dense_p4", "bucket_dense_odd_p5", "bucket_moe_p4", "bucket_dense_p2"}) {
    step = s.next(fixture(name));
    EXPECT_EQ(step.action, WorkerAction::apply_bucket) << name;
    EXPECT_FALSE(step.bucket.tensors.empty());
  }
  EXPECT_EQ(s.buckets(), 4u);
  EXPECT_EQ(s.next(fixture("end")).action, WorkerAction::release_buffer);
  EXPECT_EQ(s.phase(), WorkerSession::Phase::released);
  EXPECT_EQ(s.next(fixture("end")).action, WorkerAction::finish);
  EXPECT_TRUE(s.finished());
  try {
    (void)s.next(fixture("end"));
    ADD_FAILURE() << "a message after finish was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
  }
}

TEST(CkptEngineSession, OlderSingleEndSignalFinishesWhenConfigured) {
  WorkerSessionOptions options;
  options.release_before_finish = false;
  WorkerSession s(options);
  (void)s.next(fixture("ipc_handle"));
  EXPECT_EQ(s.next(fixture("end")).action, WorkerAction::finish);
  EXPECT_TRUE(s.finished());
}

TEST(CkptEngineSession, AbortFromTheParameterServerEndsTheSession) {
  WorkerSession s;
  (void)s.next(fixture("ipc_handle"));
  (void)s.next(fixture("bucket_dense_p4"));
  const auto step = s.next(fixture("abort"));
  EXPECT_EQ(step.action, WorkerAction::abort);
  EXPECT_EQ(step.abort.text, "Some workers failed to update weights");
  EXPECT_EQ(s.phase(), WorkerSession::Phase::aborted);
}

TEST(CkptEngineSession, MessagesOutOfOrderAreRefusedAsIncompatible) {
  const auto expect_incompatible = [](WorkerSession& s, const std::string& name, const char* needle) {
    try {
      (void)s.next(fixture(name));
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  WorkerSession fresh;
  expect_incompatible(fresh, "bucket_dense_p4", "a bucket received while awaiting the IPC handle");
  expect_incompatible(fresh, "end", "the end signal (None) received while awaiting the IPC handle");
  EXPECT_EQ(fresh.phase(), WorkerSession::Phase::awaiting_handle);
  (void)fresh.next(fixture("ipc_handle"));
  expect_incompatible(fresh, "ipc_handle", "a second IPC handle");
  (void)fresh.next(fixture("end"));
  expect_incompatible(fresh, "bucket_dense_p4", "a bucket received while buffer released");
}

TEST(CkptEngineSession, BucketOutsideTheSharedBufferIsRefusedByTensorName) {
  const auto bucket = std::get<BucketMeta>(decode_message(fixture("bucket_dense_odd_p5")));
  try {
    // lm_head.weight spans [3 GiB + 656,640, 3 GiB + 1,168,640) in the odd half.
    check_bucket_in_buffer(bucket, (3ULL << 30) + 1'000'000);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'lm_head.weight'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_bucket_in_buffer(bucket, 6ULL << 30));
}

// ---- malformed messages built by hand ---------------------------------------------------

PickleBytes bucket_of(const std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>, std::int64_t>>& tensors) {
  PickleBytes p;
  p.op(']').mark();
  for (const auto& [name, dtype, shape, offset] : tensors) p.tensor_meta(name, dtype, shape, offset);
  p.op('e').stop();
  return p;
}

TEST(CkptEngineMessages, OverlappingTensorsAreRefusedByName) {
  const auto p = bucket_of({{"a", "float32", {16}, 0}, {"b", "float32", {4}, 32}});
  const auto bucket = std::get<BucketMeta>(decode_message(p.bytes()));
  try {
    check_bucket_in_buffer(bucket, 1024);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensors 'a' and 'b' overlap"), std::string::npos) << e.what();
  }
}

TEST(CkptEngineMessages, UnsupportedDtypeNamesTheTensor) {
  const auto p = bucket_of({{"rotary.freqs", "complex64", {8}, 0}});
  const std::string m = refusal(p.bytes());
  EXPECT_NE(m.find("tensor 'rotary.freqs': dtype torch.complex64 is not supported"), std::string::npos) << m;
}

TEST(CkptEngineMessages, Fp8DtypesMapToFerryDtypes) {
  const auto p = bucket_of({{"w", "float8_e4m3fn", {128, 128}, 0}, {"v", "float8_e5m2", {2}, 16384}});
  const auto b = std::get<BucketMeta>(decode_message(p.bytes()));
  EXPECT_EQ(b.tensors[0].dtype, FERRY_DTYPE_F8_E4M3);
  EXPECT_EQ(b.tensors[1].dtype, FERRY_DTYPE_F8_E5M2);
}

TEST(CkptEngineMessages, MalformedBucketEntriesAreRefused) {
  EXPECT_NE(refusal(bucket_of({{"w", "float32", {-1}, 0}}).bytes()).find("must not be negative"),
            std::string::npos);
  EXPECT_NE(refusal(bucket_of({{"w", "float32", {1}, -8}}).bytes()).find("tensor 'w' offset must not be negative"),
            std::string::npos);
  EXPECT_NE(refusal(bucket_of({{"w", "float32", {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0}}).bytes()).find("has 9 dims"),
            std::string::npos);
  EXPECT_NE(refusal(bucket_of({{"w", "float32", {1LL << 40, 1LL << 40}, 0}}).bytes()).find("overflows"),
            std::string::npos);
  EXPECT_NE(refusal(bucket_of({{"w", "float32", {1}, 0}, {"w", "float32", {1}, 256}}).bytes())
                .find("tensor 'w' appears twice"),
            std::string::npos);
  PickleBytes missing;  // [{"name": "w"}]
  missing.op(']').op('}').str("name").str("w").op('s').op('a').stop();
  EXPECT_NE(refusal(missing.bytes()).find("must have the 4 keys"), std::string::npos);
  PickleBytes not_dict;
  not_dict.op(']').integer(3).op('a').stop();
  EXPECT_NE(refusal(not_dict.bytes()).find("bucket entry 0 must be a dict, got int 3"), std::string::npos);
}

TEST(CkptEngineMessages, MalformedIpcHandlesAreRefused) {
  // The real layout with one argument missing.
  PickleBytes short_args;
  short_args.global("torch.multiprocessing.reductions", "rebuild_cuda_tensor").op(')').op(0x86).stop();
  EXPECT_NE(refusal(short_args.bytes()).find("rebuild_cuda_tensor takes 15 arguments, got 0"), std::string::npos);
  // A tuple that names a different function.
  PickleBytes other;
  other.global("torch", "Size").op(')').op(0x86).stop();
  EXPECT_NE(refusal(other.bytes()).find("IPC handle must name torch.multiprocessing.reductions.rebuild_cuda_tensor"),
            std::string::npos);
  // A float32 buffer: checkpoint-engine's buffer is always uint8.
  PickleBytes f32;
  f32.global("torch.multiprocessing.reductions", "rebuild_cuda_tensor").mark();
  f32.global("torch", "Tensor").size({16}).integer(1).op(0x85).integer(0);
  f32.global("torch.storage", "TypedStorage").global("torch", "float32").integer(0);
  f32.bin(std::string(66, 'h')).integer(64).integer(0).op(0x89).bin("/torch_1").integer(0);
  f32.bin(std::string(64, 'e')).op(0x88).tuple().op(0x86).stop();
  EXPECT_NE(refusal(f32.bytes()).find("the buffer must be torch.uint8, got torch.float32"), std::string::npos);
}

TEST(CkptEngineMessages, StrayCallsAndScalarsAreNotMessages) {
  PickleBytes size;
  size.size({1});
  size.stop();
  EXPECT_NE(refusal(size.bytes()).find("a message cannot be a call of torch.Size"), std::string::npos);
  PickleBytes number;
  number.integer(5).stop();
  EXPECT_NE(refusal(number.bytes()).find("got int 5"), std::string::npos);
}

}  // namespace
}  // namespace ferry::ckpt_engine
