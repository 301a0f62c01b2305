// tests/capi/capi_stream_order_test.cpp: stream ordering through the C API on a GPU (docs/architecture.md,
// "Stream ordering"). In one process, as an engine that embeds its receiver and a trainer that
// pushes to it: a kernel still queued on the producer's stream when ferry_sender_push is called
// writes the tensors' final values (ferry must read those, for every way of naming the
// producer), and a kernel still queued on the engine's stream when an update arrives writes into
// a parameter (ferry must wait for it, so the update's bytes are what stays). A control shows that
// without ordering the hazard is real. The pair is one process, so `auto` must not pick CUDA IPC
// (a process cannot open its own IPC handles) and says so. Exits 77 (skip) without a CUDA device.
#include <cuda_runtime_api.h>
#include <ferry/ferry.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../session/slow_write.hpp"

namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

std::string message_of(ferry_error_t* e) {
  std::string text = e != nullptr ? ferry_error_message(e) : "";
  ferry_error_free(e);
  return text;
}
#define ASSERT_OK(call)                              \
  do {                                               \
    ferry_error_t* err_ = (call);                    \
    ASSERT_EQ(err_, nullptr) << message_of(err_);    \
  } while (0)

constexpr std::size_t kTensors = 8;
constexpr std::size_t kBytes = 1u << 20;  // per tensor (F32)
constexpr unsigned kWaitMs = 500;          // GPU time the queued kernels wait before writing

// Device memory for kTensors tensors, one allocation, with a host copy of the values.
struct DeviceSet {
  void* base = nullptr;
  std::vector<std::uint8_t> host;
  DeviceSet() {
    if (cudaMalloc(&base, kTensors * kBytes) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    host.assign(kTensors * kBytes, 0);
  }
  ~DeviceSet() { (void)cudaFree(base); }
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;
  void* at(std::size_t i) const { return static_cast<std::uint8_t*>(base) + i * kBytes; }
  void randomize(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::size_t i = 0; i < host.size(); i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(host.data() + i, &v, 8);
    }
  }
  void upload() {
    if (cudaMemcpy(base, host.data(), host.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> out(host.size());
    if (cudaMemcpy(out.data(), base, out.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
    return out;
  }
};

struct Tensors {
  std::vector<std::string> names;
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(kBytes / 4)};
  std::vector<ferry_tensor_t> structs;
  std::vector<const ferry_tensor_t*> pointers;
  explicit Tensors(const DeviceSet& set) {
    for (std::size_t i = 0; i < kTensors; ++i) names.push_back("layers." + std::to_string(i));
    structs.resize(kTensors);
    for (std::size_t i = 0; i < kTensors; ++i) {
      ferry_tensor_t& t = structs[i];
      t = ferry_tensor_t{};
      t.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, device);
      t.name = names[i].c_str();
      t.dtype = FERRY_DTYPE_F32;
      t.ndim = 1;
      t.shape = shape.data();
      t.data = set.at(i);
      t.memory_kind = FERRY_MEMORY_CUDA;
      t.device = 0;
      pointers.push_back(&t);
    }
  }
};

enum class Named { streams, events, sync_devices, none };

class CapiStreamOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CUDA(cudaSetDevice(0));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking));
    params_.randomize(1);
    params_.upload();
    ASSERT_OK(ferry_receiver_create(nullptr, &receiver_));
    Tensors params(params_);
    for (const auto* p : params.pointers) ASSERT_OK(ferry_receiver_register_param(receiver_, p));
    // The receiver's own wait (for the engine) would synchronise the device, and so hide a
    // sender that read too early; the engine test sets it again.
    ASSERT_OK(ferry_receiver_set_engine_order(receiver_, FERRY_ORDER_NONE, nullptr, 0));
    std::int32_t port = 0;
    ASSERT_OK(ferry_receiver_serve(receiver_, "127.0.0.1", 0, &port));
    address_ = "127.0.0.1:" + std::to_string(port);
    const char* receivers[] = {address_.c_str()};
    ferry_sender_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_sender_create_args_t, commit_timeout_ms);
    args.receivers = receivers;
    args.num_receivers = 1;
    ASSERT_OK(ferry_sender_create(&args, &sender_));
  }
  void TearDown() override {
    ferry_sender_destroy(sender_);
    ferry_receiver_destroy(receiver_);
    (void)cudaStreamSynchronize(producer_);
    (void)cudaStreamDestroy(producer_);
  }

  // Queues "the optimizer step": after kWaitMs on the GPU, `next` is copied into the tensors.
  void queue_producer(DeviceSet& tensors, const DeviceSet& next) {
    ASSERT_CUDA(ferry::test::enqueue_slow_copy(next.base, tensors.base, kTensors * kBytes, kWaitMs,
                                               producer_));
    tensors.host = next.host;
  }

  // Pushes `tensors` as `version`; returns the report's first receiver result.
  ferry_receiver_result_t push(const DeviceSet& tensors, std::uint64_t version, Named named,
                               cudaEvent_t event = nullptr) {
    Tensors views(tensors);
    ferry_push_args_t a{};
    a.struct_size = FERRY_STRUCT_SIZE(ferry_push_args_t, num_order_handles);
    a.tensors = views.pointers.data();
    a.num_tensors = views.pointers.size();
    a.version = version;
    const void* handles[1] = {nullptr};
    switch (named) {
      case Named::streams:
        a.order = FERRY_ORDER_STREAMS;
        handles[0] = producer_;
        a.order_handles = handles;
        a.num_order_handles = 1;
        break;
      case Named::events:
        a.order = FERRY_ORDER_EVENTS;
        handles[0] = event;
        a.order_handles = handles;
        a.num_order_handles = 1;
        break;
      case Named::sync_devices: a.order = FERRY_ORDER_SYNC_DEVICES; break;
      case Named::none: a.order = FERRY_ORDER_NONE; break;
    }
    ferry_push_report_t* report = nullptr;
    ferry_error_t* e = ferry_sender_push(sender_, &a, &report);
    EXPECT_EQ(e, nullptr) << message_of(e);
    ferry_receiver_result_t r{};
    r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reused_session);
    if (report != nullptr) {
      EXPECT_EQ(ferry_push_report_receiver(report, 0, &r), nullptr);
      transport_ = r.transport != nullptr ? r.transport : "";
      error_ = r.error != nullptr ? r.error : "";
      ferry_push_report_free(report);
    }
    return r;
  }

  cudaStream_t producer_ = nullptr;
  DeviceSet params_;  // the engine's parameters
  ferry_receiver_t* receiver_ = nullptr;
  ferry_sender_t* sender_ = nullptr;
  std::string address_;
  std::string transport_;
  std::string error_;
};

TEST_F(CapiStreamOrder, APushRightAfterTheProducersKernelReadsItsFinalBytesHoweverItIsNamed) {
  DeviceSet tensors;
  tensors.randomize(2);
  tensors.upload();
  DeviceSet next;
  std::uint64_t version = 0;
  for (const Named named : {Named::streams, Named::events, Named::sync_devices}) {
    SCOPED_TRACE(static_cast<int>(named));
    next.randomize(100 + version);
    next.upload();
    queue_producer(tensors, next);
    cudaEvent_t event = nullptr;
    ASSERT_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    ASSERT_CUDA(cudaEventRecord(event, producer_));
    const auto r = push(tensors, ++version, named, event);
    ASSERT_CUDA(cudaEventDestroy(event));
    ASSERT_TRUE(r.committed) << error_;
    ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(params_.download() == tensors.host) << "the receiver holds bytes the producer "
                                                       "had not written yet";
    // One process: CUDA IPC cannot serve the pair, and auto took another path.
    EXPECT_NE(transport_, "cuda_ipc");
  }
}

// The control: with FERRY_ORDER_NONE (the caller claims it synchronised, and did not), ferry
// reads before the producer's kernel wrote: the hazard the ordering removes is real here.
TEST_F(CapiStreamOrder, WithoutOrderingThePushWouldReadTheBytesBeforeTheProducersKernel) {
  DeviceSet tensors;
  tensors.randomize(3);
  tensors.upload();
  const auto before = tensors.host;
  DeviceSet next;
  next.randomize(300);
  next.upload();
  queue_producer(tensors, next);
  const auto r = push(tensors, 1, Named::none);
  ASSERT_TRUE(r.committed) << error_;
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(params_.download() == before);
}

// The engine's stream still has a kernel queued that writes into its parameters when the update
// arrives: the update waits for it, so the update's bytes are what the parameters hold after.
TEST_F(CapiStreamOrder, AnUpdateWaitsForTheEnginesQueuedWorkBeforeWritingItsParameters) {
  cudaStream_t engine = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
  DeviceSet tensors;
  std::uint64_t version = 0;
  for (const bool by_stream : {true, false}) {
    SCOPED_TRACE(by_stream ? "engine stream named" : "default: the device synchronised");
    if (by_stream) {
      const void* handles[1] = {engine};
      ASSERT_OK(ferry_receiver_set_engine_order(receiver_, FERRY_ORDER_STREAMS, handles, 1));
    } else {
      ASSERT_OK(ferry_receiver_set_engine_order(receiver_, FERRY_ORDER_SYNC_DEVICES, nullptr, 0));
    }
    tensors.randomize(500 + version);
    tensors.upload();
    ASSERT_CUDA(ferry::test::enqueue_slow_fill(params_.base, kTensors * kBytes, 0xA5, kWaitMs,
                                               engine));
    // The tensors are final (synchronous upload); a sender's device synchronisation would also
    // wait for the engine's kernel, so none here: only the receiver's wait is tested.
    const auto r = push(tensors, ++version, Named::none);
    ASSERT_TRUE(r.committed) << error_;
    ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(params_.download() == tensors.host)
        << "the engine's queued kernel overwrote the update";
  }
  ASSERT_CUDA(cudaStreamDestroy(engine));
}

// The control: an engine that claims to be idle (FERRY_ORDER_NONE) while its kernel is queued
// loses the update to that kernel's late write.
TEST_F(CapiStreamOrder, WithoutOrderingTheEnginesLateKernelWouldOverwriteTheUpdate) {
  cudaStream_t engine = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
  DeviceSet tensors;
  tensors.randomize(700);
  tensors.upload();
  ASSERT_CUDA(ferry::test::enqueue_slow_fill(params_.base, kTensors * kBytes, 0xA5, kWaitMs,
                                             engine));
  const auto r = push(tensors, 1, Named::none);
  ASSERT_TRUE(r.committed) << error_;
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto held = params_.download();
  EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](std::uint8_t b) { return b == 0xA5; }));
  ASSERT_CUDA(cudaStreamDestroy(engine));
}

TEST_F(CapiStreamOrder, BadOrdersAreRefusedWithTheirReason) {
  DeviceSet tensors;
  Tensors views(tensors);
  ferry_push_args_t a{};
  a.struct_size = FERRY_STRUCT_SIZE(ferry_push_args_t, num_order_handles);
  a.tensors = views.pointers.data();
  a.num_tensors = views.pointers.size();
  a.version = 1;
  a.order = FERRY_ORDER_STREAMS;  // and no stream
  ferry_error_t* e = ferry_sender_push(sender_, &a, nullptr);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(ferry_error_code(e), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(message_of(e).find("names no stream"), std::string::npos);
  const void* handles[1] = {producer_};
  e = ferry_receiver_set_engine_order(receiver_, FERRY_ORDER_EVENTS, handles, 1);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(message_of(e).find("events are recorded once"), std::string::npos);
}

}  // namespace
