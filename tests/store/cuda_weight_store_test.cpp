// Tests of the CUDA weight store on a real device: stable addresses across release/resume,
// device memory really returned and taken again, no leaks over many cycles, exact backups
// through the page-locked mirror, discard semantics, a captured CUDA graph that keeps working,
// out of memory on resume, and engine-owned parameters. Exits 77 (meson's skip code) without a
// CUDA device.
#include "store/cuda_weight_store.hpp"
#include "store/host_mirror.hpp"

#include "cuda_graph_kernel.hpp"

#include <ferry/sdk/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace ferry::store {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetLastError()

struct DeviceMemory {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};

DeviceMemory device_memory() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return {free_bytes, total_bytes};
}

std::uint64_t distance(std::uint64_t a, std::uint64_t b) {
  return a > b ? a - b : b - a;
}

// A field of /proc/self/status in kB ("VmLck", "VmPin"), 0 when absent.
std::uint64_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<std::byte>(rng());
  return out;
}

bool all_zero(const std::vector<std::byte>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

std::vector<std::byte> read_all(const WeightStore& store, std::size_t index) {
  std::vector<std::byte> out(store.param(index).bytes);
  store.read(index, 0, out);
  return out;
}

void write_all(WeightStore& store, std::size_t index, const std::vector<std::byte>& bytes) {
  store.write(index, 0, bytes);
}

// The wrapping uint64 sum of the 32-bit words of `bytes` (the CPU twin of the test kernel).
unsigned long long word_sum(const std::vector<std::byte>& bytes) {
  unsigned long long sum = 0;
  for (std::size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    std::uint32_t word = 0;
    std::memcpy(&word, bytes.data() + i, 4);
    sum += word;
  }
  return sum;
}

// Fills every free physical page it can get with `value`, then frees them again, so that memory
// mapped next holds that value unless something overwrites it.
void poison_free_memory(unsigned char value) {
  std::vector<void*> blocks;
  for (std::uint64_t size = kGiB; size >= 2 * kMiB;) {
    void* block = nullptr;
    if (device_memory().free < size + 256 * kMiB || cudaMalloc(&block, size) != cudaSuccess) {
      (void)cudaGetLastError();
      size /= 2;
      continue;
    }
    (void)cudaMemset(block, value, size);
    blocks.push_back(block);
  }
  (void)cudaDeviceSynchronize();
  for (void* block : blocks) (void)cudaFree(block);
}

template <typename Body>
ferry_status_code_t code_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.code();
  }
  return FERRY_STATUS_OK;
}

template <typename Body>
std::string message_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

const std::vector<std::string> kWeights = {"weights"};

TEST(CudaWeightStore, ReleaseKeepsVirtualAddress) {
  CudaWeightStore store;
  EXPECT_EQ(store.region_memory_kind(), FERRY_MEMORY_CUDA);
  store.place_all("weights", Policy::Backup,
                  std::vector<TensorSpec>{{"w", FERRY_DTYPE_F32, {1024, 1024}}});
  store.place_all("staging", Policy::Discard,
                  std::vector<TensorSpec>{{"s", FERRY_DTYPE_U8, {3 * kMiB}}});
  const ParamInfo w = store.param("w");
  const ParamInfo s = store.param("s");
  EXPECT_EQ(w.memory_kind, FERRY_MEMORY_CUDA);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.data) % store.granularity(), 0u);
  const std::vector<std::string> both = {"weights", "staging"};
  store.release(both);
  EXPECT_TRUE(store.released("weights"));
  EXPECT_TRUE(store.released("staging"));
  EXPECT_EQ(store.param("w").data, w.data);
  store.resume(both);
  EXPECT_EQ(store.param("w").data, w.data);
  EXPECT_EQ(store.param("s").data, s.data);
  EXPECT_FALSE(store.released("weights"));
  // The resumed memory is usable through the raw pointer.
  const std::vector<std::byte> bytes = random_bytes(s.bytes, 7);
  ASSERT_CUDA(cudaMemcpy(s.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  EXPECT_EQ(read_all(store, *store.find("s")), bytes);
}

TEST(CudaWeightStore, ReleaseReturnsDeviceMemoryAndResumeTakesItAgain) {
  CudaWeightStoreOptions options;
  options.chunk_bytes = kGiB;
  CudaWeightStore store(options);
  const std::uint64_t bytes = std::min<std::uint64_t>(4 * kGiB, device_memory().free / 4);
  const DeviceMemory before_create = device_memory();
  store.create_region("kv_cache", bytes, Policy::Discard);
  const std::uint64_t capacity = store.memory_state().front().bytes;
  ASSERT_GE(capacity, bytes);
  const std::uint64_t slack = 64 * kMiB;

  const DeviceMemory mapped = device_memory();
  EXPECT_GE(before_create.free - mapped.free + slack, capacity);
  store.release(std::vector<std::string>{"kv_cache"});
  const DeviceMemory released = device_memory();
  EXPECT_GE(released.free, mapped.free + capacity - slack)
      << "free " << mapped.free << " -> " << released.free << " after releasing " << capacity;
  store.resume(std::vector<std::string>{"kv_cache"});
  const DeviceMemory resumed = device_memory();
  EXPECT_LE(resumed.free + capacity, released.free + slack)
      << "free " << released.free << " -> " << resumed.free << " after resuming " << capacity;
  EXPECT_LE(distance(resumed.free, mapped.free), slack);
}

TEST(CudaWeightStore, HundredCyclesLeakNoDeviceOrPinnedMemory) {
  CudaWeightStoreOptions options;
  options.chunk_bytes = 64 * kMiB;  // several chunks per region
  CudaWeightStore store(options);
  const auto w = store.place_all("weights", Policy::Backup,
                                 std::vector<TensorSpec>{{"w", FERRY_DTYPE_U8, {200 * kMiB}}});
  store.place_all("kv_cache", Policy::Discard,
                  std::vector<TensorSpec>{{"kv", FERRY_DTYPE_U8, {130 * kMiB}}});
  const std::vector<std::byte> contents = random_bytes(200 * kMiB, 11);
  write_all(store, w, contents);
  const std::vector<std::string> both = {"weights", "kv_cache"};

  // One cycle first: it creates and page-locks the mirror and warms up the copy streams.
  store.release(both);
  store.resume(both);
  const auto mirror = store.mirror();
  ASSERT_NE(mirror, nullptr);
  const std::uint64_t pinned = store.pinned_mirror_bytes();
  EXPECT_EQ(pinned, mirror->data_bytes());
  unsigned int flags = 0;
  EXPECT_EQ(cudaHostGetFlags(&flags, mirror->slot(0)), cudaSuccess) << "mirror is not pinned";
  const std::uint64_t free_before = device_memory().free;
  const std::uint64_t locked_before = status_kib("VmLck") + status_kib("VmPin");

  for (int cycle = 0; cycle < 100; ++cycle) {
    store.release(both);
    store.resume(both);
  }

  EXPECT_LE(distance(device_memory().free, free_before), 4 * kMiB)
      << "free device memory " << free_before << " -> " << device_memory().free;
  EXPECT_EQ(store.mirror(), mirror);
  EXPECT_EQ(store.pinned_mirror_bytes(), pinned);
  EXPECT_EQ(status_kib("VmLck") + status_kib("VmPin"), locked_before);
  EXPECT_EQ(read_all(store, w), contents);
}

TEST(CudaWeightStore, BackupPolicyRestoresExactRandomContentsAfterPoison) {
  CudaWeightStoreOptions options;
  options.chunk_bytes = 64 * kMiB;
  options.copy_chunk_bytes = 16 * kMiB;  // many pipeline pieces, one crossing each chunk edge
  CudaWeightStore store(options);
  const std::vector<TensorSpec> specs = {{"big", FERRY_DTYPE_BF16, {3, 50 * kMiB / 2 + 3}},
                                         {"odd", FERRY_DTYPE_F32, {13, 7}},
                                         {"tail", FERRY_DTYPE_U8, {5 * kMiB + 1}}};
  const auto first = store.place_all("weights", Policy::Backup, specs);
  std::vector<std::vector<std::byte>> contents;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    contents.push_back(random_bytes(store.param(first + i).bytes, 100 + i));
    ASSERT_FALSE(all_zero(contents.back()));
    write_all(store, first + i, contents.back());
  }
  const std::byte* big = store.param("big").data;

  store.release(kWeights);
  // The mirror holds exactly what the device held.
  const auto mirror = store.mirror();
  ASSERT_NE(mirror, nullptr);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto entry = mirror->find(specs[i].name);
    ASSERT_TRUE(entry.has_value());
    ASSERT_TRUE(mirror->filled(*entry));
    EXPECT_EQ(std::memcmp(mirror->slot(*entry), contents[i].data(), contents[i].size()), 0)
        << specs[i].name;
  }
  poison_free_memory(0xa5);
  store.resume(kWeights);
  EXPECT_EQ(store.param("big").data, big);
  EXPECT_TRUE(store.contents_valid("weights"));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(read_all(store, first + i), contents[i]) << specs[i].name;
  }

  // The restore path alone, deterministically: poison the live weights, restore from the mirror.
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ASSERT_CUDA(cudaMemset(store.param(first + i).data, 0x5a, store.param(first + i).bytes));
  }
  store.restore_from_mirror(kWeights);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(read_all(store, first + i), contents[i]) << specs[i].name;
  }
}

TEST(CudaWeightStore, DiscardPolicyReportsContentsInvalidUntilRewritten) {
  CudaWeightStore store;
  const auto index = store.place_all("weights", Policy::Discard,
                                     std::vector<TensorSpec>{{"w", FERRY_DTYPE_F16, {4096, 33}}});
  write_all(store, index, random_bytes(store.param(index).bytes, 3));
  EXPECT_TRUE(store.contents_valid("weights"));
  store.release(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));
  EXPECT_NE(store.invalid_reason("weights").find("discard"), std::string::npos)
      << store.invalid_reason("weights");
  std::vector<std::byte> out(16);
  EXPECT_EQ(code_of([&] { store.read(index, 0, out); }), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(code_of([&] { store.write(index, 0, out); }), FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(code_of([&] { store.release(kWeights); }), FERRY_STATUS_FAILED_PRECONDITION);
  store.resume(kWeights);
  EXPECT_FALSE(store.contents_valid("weights"));
  EXPECT_EQ(code_of([&] { store.resume(kWeights); }), FERRY_STATUS_FAILED_PRECONDITION);
  const auto fresh = random_bytes(store.param(index).bytes, 4);
  write_all(store, index, fresh);
  store.set_contents_valid("weights", true, {});
  EXPECT_TRUE(store.contents_valid("weights"));
  EXPECT_EQ(store.invalid_reason("weights"), "");
  EXPECT_EQ(read_all(store, index), fresh);
}

TEST(CudaWeightStore, CapturedGraphReplaysCorrectlyAfterReleaseResumeAndWrite) {
  CudaWeightStore store;
  const std::uint64_t words = 16 * kMiB / 4 + 5;
  const auto w = store.place_all("weights", Policy::Backup,
                                 std::vector<TensorSpec>{{"w", FERRY_DTYPE_I32, {words}}});
  const std::vector<std::byte> first = random_bytes(words * 4, 21);
  write_all(store, w, first);
  const void* data = store.param(w).data;

  unsigned long long* out = nullptr;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(*out)));
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto result = [&] {
    unsigned long long value = 0;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&value, out, sizeof(value), cudaMemcpyDeviceToHost), cudaSuccess);
    return value;
  };
  auto poison_out = [&] {
    const unsigned long long poison = 0xdeadbeefdeadbeefull;
    EXPECT_EQ(cudaMemcpy(out, &poison, sizeof(poison), cudaMemcpyHostToDevice), cudaSuccess);
  };
  auto eager = [&] {
    poison_out();
    EXPECT_EQ(testing::enqueue_word_sum(data, words, out, stream), cudaSuccess);
    return result();
  };

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA(testing::enqueue_word_sum(data, words, out, stream));
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&] {
    poison_out();
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    return result();
  };

  const unsigned long long expected_first = word_sum(first);
  EXPECT_EQ(eager(), expected_first);
  EXPECT_EQ(replay(), expected_first);

  store.release(kWeights);
  poison_free_memory(0x3c);
  store.resume(kWeights);
  ASSERT_EQ(store.param(w).data, data);
  EXPECT_EQ(replay(), expected_first);
  EXPECT_EQ(eager(), expected_first);

  const std::vector<std::byte> second = random_bytes(words * 4, 22);
  write_all(store, w, second);
  const unsigned long long expected_second = word_sum(second);
  ASSERT_NE(expected_second, expected_first);
  EXPECT_EQ(replay(), expected_second);
  EXPECT_EQ(eager(), expected_second);

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(out), cudaSuccess);
}

TEST(CudaWeightStore, OutOfMemoryOnResumeNamesTheAmountsAndLeavesTheTagReleased) {
  CudaWeightStoreOptions options;
  options.chunk_bytes = 256 * kMiB;
  CudaWeightStore store(options);
  const std::uint64_t region = 2 * kGiB;
  store.create_region("weights", region, Policy::Backup);
  const std::uint64_t head_bytes = 32 * kMiB;
  const std::uint64_t head_shape[] = {head_bytes};
  const auto head = store.place("weights", "head", FERRY_DTYPE_U8, head_shape);
  const std::uint64_t rest_shape[] = {region - 64 * kMiB};
  store.place("weights", "rest", FERRY_DTYPE_U8, rest_shape);
  const std::vector<std::byte> contents = random_bytes(head_bytes, 31);
  write_all(store, head, contents);
  const std::byte* address = store.param(head).data;
  store.release(kWeights);

  // Leave about 1 GiB free: room for some chunks of the tag, not for all of it.
  std::vector<void*> filler;
  for (std::uint64_t size = 16 * kGiB; size >= 2 * kMiB;) {
    void* block = nullptr;
    if (device_memory().free < size + kGiB || cudaMalloc(&block, size) != cudaSuccess) {
      (void)cudaGetLastError();
      size /= 2;
      continue;
    }
    filler.push_back(block);
  }
  const DeviceMemory before = device_memory();
  ASSERT_LT(before.free, region) << "could not fill the device";
  ASSERT_GT(before.free, options.chunk_bytes);

  Error error(FERRY_STATUS_OK, "");
  try {
    store.resume(kWeights);
  } catch (const Error& e) {
    error = e;
  }
  EXPECT_EQ(error.code(), FERRY_STATUS_OUT_OF_MEMORY) << error.what();
  const std::string message = error.what();
  EXPECT_NE(message.find("'weights'"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(region) + " bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("free"), std::string::npos) << message;
  EXPECT_TRUE(store.released("weights"));
  // Whatever was mapped before the failure was given back.
  EXPECT_LE(distance(device_memory().free, before.free), 4 * kMiB)
      << "free " << before.free << " -> " << device_memory().free;
  std::vector<std::byte> out(16);
  EXPECT_EQ(code_of([&] { store.read(head, 0, out); }), FERRY_STATUS_FAILED_PRECONDITION);

  for (void* block : filler) ASSERT_CUDA(cudaFree(block));
  store.resume(kWeights);
  EXPECT_FALSE(store.released("weights"));
  EXPECT_EQ(store.param(head).data, address);
  EXPECT_EQ(read_all(store, head), contents);
}

TEST(CudaWeightStore, EngineOwnedParamsAreWrittenInPlaceAndTheirReleaseSavesThem) {
  CudaWeightStore store;
  const std::uint64_t bytes = 3 * kMiB + 12;
  void* engine = nullptr;
  ASSERT_CUDA(cudaMalloc(&engine, bytes));
  const std::uint64_t shape[] = {bytes / 4};
  const auto index =
      store.register_external("engine", "e", FERRY_DTYPE_F32, shape, engine, FERRY_MEMORY_CUDA);
  const ParamInfo info = store.param(index);
  EXPECT_EQ(info.data, engine);
  EXPECT_TRUE(info.external);
  EXPECT_EQ(info.memory_kind, FERRY_MEMORY_CUDA);

  const std::vector<std::byte> contents = random_bytes(bytes, 41);
  write_all(store, index, contents);
  std::vector<std::byte> back(bytes);
  ASSERT_CUDA(cudaMemcpy(back.data(), engine, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, contents);

  const std::vector<std::string> tag = {"engine"};
  // The engine's release (it is about to free or remap that memory): with backup, saved; the
  // memory is not touched; the engine's new memory gets the weights back at the resume.
  store.set_policy("engine", Policy::Backup);
  store.release(tag);
  EXPECT_TRUE(store.released("engine"));
  ASSERT_CUDA(cudaMemcpy(back.data(), engine, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, contents) << "ferry changed memory it does not own";
  ASSERT_CUDA(cudaMemset(engine, 0, bytes));  // what the engine's allocator maps back
  store.resume(tag);
  EXPECT_FALSE(store.released("engine"));
  ASSERT_CUDA(cudaMemcpy(back.data(), engine, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, contents);
  // Rollback through the mirror writes into the engine's memory too.
  store.save_to_mirror(tag);
  ASSERT_CUDA(cudaMemset(engine, 0x77, bytes));
  store.restore_from_mirror(tag);
  EXPECT_EQ(store.param(index).data, engine);
  ASSERT_CUDA(cudaMemcpy(back.data(), engine, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, contents);

  std::vector<float> host(16);
  const std::uint64_t small[] = {16};
  EXPECT_EQ(code_of([&] {
              store.register_external("engine", "host", FERRY_DTYPE_F32, small, host.data(),
                                      FERRY_MEMORY_CUDA);
            }),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(code_of([&] {
              store.register_external("engine", "kind", FERRY_DTYPE_F32, small, engine,
                                      FERRY_MEMORY_HOST);
            }),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(store.param_count(), 1u);
  EXPECT_EQ(cudaFree(engine), cudaSuccess);
}

TEST(CudaWeightStore, RefusesAnAbsentDevice) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  CudaWeightStoreOptions options;
  options.device = count;
  const std::string message = message_of([&] { CudaWeightStore store(options); });
  EXPECT_NE(message.find(std::to_string(count)), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { CudaWeightStore store(options); }), FERRY_STATUS_NOT_FOUND);
}

}  // namespace
}  // namespace ferry::store
