// Tests of the CUDA kernels against their CPU twins on random data: scatter (copies and casts,
// aligned and misaligned, many tiny ops with a huge one, bad plans refused) and the fingerprint
// (chunk boundaries, misaligned input; many ranges of every size and alignment in one call).
// Exits 77 (meson's skip code) without a CUDA device.
#include "ferry/kernels/cpu.hpp"
#include "ferry/kernels/cuda.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace fk = ferry::kernels;

namespace {

constexpr unsigned char kPoison = 0xA5;
constexpr std::uint64_t kMiB = 1ull << 20;

void cuda_ok(cudaError_t err, const char* what) {
  ASSERT_EQ(err, cudaSuccess) << what << ": " << cudaGetErrorString(err);
}

// A device buffer with a host mirror.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::uint64_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(ptr_); }
  void upload(const std::vector<unsigned char>& host) const {
    cuda_ok(cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes_);
    cuda_ok(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  void* ptr_ = nullptr;
  std::uint64_t bytes_;
};

// Random finite values of `dtype` (never zero), as bytes.
std::vector<unsigned char> random_values(ferry_dtype_t dtype, std::uint64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> out(n * ferry::dtype_size(dtype));
  if (dtype == FERRY_DTYPE_BOOL || dtype == FERRY_DTYPE_U8 || dtype == FERRY_DTYPE_I8 ||
      dtype == FERRY_DTYPE_I16 || dtype == FERRY_DTYPE_I32 || dtype == FERRY_DTYPE_I64) {
    std::vector<std::uint8_t> v(n);
    for (auto& x : v) x = static_cast<std::uint8_t>(rng() % 255 + 1);
    if (dtype == FERRY_DTYPE_BOOL) {
      std::memcpy(out.data(), v.data(), n);
    } else {
      fk::convert_elements(v.data(), dtype == FERRY_DTYPE_U8 ? FERRY_DTYPE_U8 : FERRY_DTYPE_I8,
                           out.data(), dtype, n);
    }
    return out;
  }
  std::uniform_real_distribution<double> mag(1e-3, 400.0);
  std::vector<double> v(n);
  for (auto& x : v) x = (rng() & 1 ? 1.0 : -1.0) * mag(rng);
  fk::convert_elements(v.data(), FERRY_DTYPE_F64, out.data(), dtype, n);
  return out;
}

ferry_plan_op_t make_op(std::uint32_t src_tensor, ferry_dtype_t src_dtype,
                        std::uint64_t src_offset, std::uint64_t src_row_stride,
                        std::uint32_t dst_param, ferry_dtype_t dst_dtype,
                        std::uint64_t dst_offset, std::uint64_t dst_row_stride,
                        std::uint64_t rows, std::uint64_t cols, ferry_transform_t transform) {
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src_tensor;
  op.src_dtype = src_dtype;
  op.src_offset = src_offset;
  op.src_row_stride = src_row_stride;
  op.dst_param = dst_param;
  op.dst_dtype = dst_dtype;
  op.dst_offset = dst_offset;
  op.dst_row_stride = dst_row_stride;
  op.rows = rows;
  op.cols = cols;
  op.transform = transform;
  return op;
}

// One tensor on both sides: host bytes and a device copy, optionally starting `shift` bytes into
// its allocation (to make misaligned element addresses).
struct Tensor {
  ferry_dtype_t dtype;
  std::uint64_t elements;
  std::uint64_t shift;
  std::vector<unsigned char> host;  // shift + elements * size bytes
  DeviceBuffer device;

  Tensor(ferry_dtype_t d, std::uint64_t n, std::uint64_t s, std::vector<unsigned char> values)
      : dtype(d), elements(n), shift(s), host(s, kPoison), device(s + n * ferry::dtype_size(d)) {
    host.insert(host.end(), values.begin(), values.end());
    device.upload(host);
  }
  fk::EntryView host_entry() const {
    return {reinterpret_cast<const std::byte*>(host.data()) + shift, dtype, elements};
  }
  fk::EntryView device_entry() const { return {device.data() + shift, dtype, elements}; }
  fk::ParamView host_param() {
    return {reinterpret_cast<std::byte*>(host.data()) + shift, dtype, elements};
  }
  fk::ParamView device_param() const { return {device.data() + shift, dtype, elements}; }
};

Tensor poisoned_tensor(ferry_dtype_t dtype, std::uint64_t n, std::uint64_t shift = 0) {
  return Tensor(dtype, n, shift,
                std::vector<unsigned char>(n * ferry::dtype_size(dtype), kPoison));
}

// Runs the plan on the CPU (host mirrors) and on the GPU, and compares every destination byte.
void expect_gpu_equals_cpu(const std::vector<ferry_plan_op_t>& ops,
                           const std::vector<Tensor*>& entries, const std::vector<Tensor*>& params,
                           const char* what) {
  std::vector<fk::EntryView> host_entries, device_entries;
  for (Tensor* e : entries) {
    host_entries.push_back(e->host_entry());
    device_entries.push_back(e->device_entry());
  }
  std::vector<fk::ParamView> host_params, device_params;
  for (Tensor* p : params) {
    host_params.push_back(p->host_param());
    device_params.push_back(p->device_param());
  }
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  fk::scatter_cuda(ops, device_entries, device_params, stream);
  cuda_ok(cudaStreamSynchronize(stream), "sync");
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
  fk::scatter_cpu(ops, host_entries, host_params, 2);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto gpu = params[i]->device.download();
    ASSERT_EQ(gpu.size(), params[i]->host.size());
    std::uint64_t first_diff = gpu.size();
    for (std::uint64_t b = 0; b < gpu.size(); ++b) {
      if (gpu[b] != params[i]->host[b]) {
        first_diff = b;
        break;
      }
    }
    EXPECT_EQ(first_diff, gpu.size()) << what << ": param " << i << " differs at byte "
                                      << first_diff;
    // Something was written (the comparison is not poison against poison).
    EXPECT_NE(params[i]->host, std::vector<unsigned char>(params[i]->host.size(), kPoison))
        << what << ": param " << i;
  }
}

}  // namespace

TEST(GpuScatter, CastBetweenEveryPairMatchesTheCpu) {
  const ferry_dtype_t floats[] = {FERRY_DTYPE_F64,  FERRY_DTYPE_F32,     FERRY_DTYPE_F16,
                                  FERRY_DTYPE_BF16, FERRY_DTYPE_F8_E4M3, FERRY_DTYPE_F8_E5M2};
  const ferry_dtype_t ints[] = {FERRY_DTYPE_BOOL, FERRY_DTYPE_U8,  FERRY_DTYPE_I8,
                                FERRY_DTYPE_I16,  FERRY_DTYPE_I32, FERRY_DTYPE_I64};
  unsigned seed = 1;
  auto run_pair = [&](ferry_dtype_t s, ferry_dtype_t d) {
    for (std::uint64_t shift : {0u, 1u}) {  // 1: misaligned element addresses
      // [37, 1000] source, a [37, 600] block from column 7 into a [37, 640] destination at 5.
      Tensor src(s, 37 * 1000, shift, random_values(s, 37 * 1000, ++seed));
      Tensor dst = poisoned_tensor(d, 37 * 640, shift);
      const auto op = make_op(0, s, 7, 1000, 0, d, 5, 640, 37, 600, FERRY_TRANSFORM_CAST);
      const std::string what = std::string(ferry::dtype_name(s)) + " -> " +
                               ferry::dtype_name(d) + (shift ? " misaligned" : "");
      expect_gpu_equals_cpu({op}, {&src}, {&dst}, what.c_str());
    }
  };
  for (ferry_dtype_t s : floats) {
    for (ferry_dtype_t d : floats) run_pair(s, d);
  }
  for (ferry_dtype_t s : ints) {
    for (ferry_dtype_t d : ints) {
      if (fk::cast_supported(s, d)) run_pair(s, d);
    }
  }
}

TEST(GpuScatter, CopiesOfEveryShapeAndAlignmentMatchTheCpu) {
  Tensor src(FERRY_DTYPE_BF16, 3 * kMiB, 0, random_values(FERRY_DTYPE_BF16, 3 * kMiB, 100));
  Tensor odd(FERRY_DTYPE_U8, 100003, 3, random_values(FERRY_DTYPE_U8, 100003, 101));
  Tensor dst = poisoned_tensor(FERRY_DTYPE_BF16, 3 * kMiB);
  Tensor odd_dst = poisoned_tensor(FERRY_DTYPE_U8, 100010, 0);
  const std::vector<ferry_plan_op_t> ops = {
      // Contiguous 1 Mi elements at an odd element offset (not 16-byte aligned; same alignment on
      // both sides).
      make_op(0, FERRY_DTYPE_BF16, 1, 0, 0, FERRY_DTYPE_BF16, 1, 0, 1, kMiB, FERRY_TRANSFORM_COPY),
      // A dim-1 shard: 512 rows of 700 columns out of 2048, at different alignments.
      make_op(0, FERRY_DTYPE_BF16, kMiB + 3, 2048, 0, FERRY_DTYPE_BF16, kMiB + 8, 1024, 512, 700,
              FERRY_TRANSFORM_COPY),
      // Byte copy whose source and destination alignments differ.
      make_op(1, FERRY_DTYPE_U8, 0, 0, 1, FERRY_DTYPE_U8, 2, 0, 1, 100003, FERRY_TRANSFORM_COPY),
  };
  expect_gpu_equals_cpu(ops, {&src, &odd}, {&dst, &odd_dst}, "copies");
}

TEST(GpuScatter, ManyTinyOpsAndOneHugeOpMatchTheCpu) {
  constexpr std::uint64_t kTiny = 20000;
  constexpr std::uint64_t kHuge = 64 * kMiB;
  Tensor tiny(FERRY_DTYPE_F32, kTiny * 3, 0, random_values(FERRY_DTYPE_F32, kTiny * 3, 200));
  Tensor huge(FERRY_DTYPE_BF16, kHuge, 0, random_values(FERRY_DTYPE_BF16, kHuge, 201));
  Tensor tiny_dst = poisoned_tensor(FERRY_DTYPE_BF16, kTiny * 4);
  Tensor huge_dst = poisoned_tensor(FERRY_DTYPE_BF16, kHuge);
  Tensor huge_cast = poisoned_tensor(FERRY_DTYPE_F32, kHuge / 2);
  std::vector<ferry_plan_op_t> ops;
  for (std::uint64_t i = 0; i < kTiny; ++i) {
    ops.push_back(make_op(0, FERRY_DTYPE_F32, i * 3, 3, 0, FERRY_DTYPE_BF16, i * 4, 3, 1, 3,
                          FERRY_TRANSFORM_CAST));
  }
  ops.insert(ops.begin() + kTiny / 2, make_op(1, FERRY_DTYPE_BF16, 0, 0, 1, FERRY_DTYPE_BF16, 0,
                                              0, 1, kHuge, FERRY_TRANSFORM_COPY));
  ops.push_back(make_op(1, FERRY_DTYPE_BF16, 0, 8192, 2, FERRY_DTYPE_F32, 0, 4096,
                        kHuge / 8192, 4096, FERRY_TRANSFORM_CAST));
  expect_gpu_equals_cpu(ops, {&tiny, &huge}, {&tiny_dst, &huge_dst, &huge_cast}, "tiny+huge");
}

TEST(GpuScatter, BadPlanIsRefusedBeforeAnythingIsWritten) {
  Tensor src(FERRY_DTYPE_BF16, 64, 0, random_values(FERRY_DTYPE_BF16, 64, 300));
  Tensor dst = poisoned_tensor(FERRY_DTYPE_BF16, 64);
  const std::vector<ferry_plan_op_t> ops = {
      make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 8, 8, 8, FERRY_TRANSFORM_COPY),
      make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 1, 8, 8, 8, FERRY_TRANSFORM_COPY)};
  const std::vector<fk::EntryView> entries = {src.device_entry()};
  const std::vector<fk::ParamView> params = {dst.device_param()};
  try {
    fk::scatter_cuda(ops, entries, params, nullptr);
    ADD_FAILURE() << "a block ending past the parameter was accepted";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("plan op 1"), std::string::npos) << e.what();
  }
  cuda_ok(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(dst.device.download(), std::vector<unsigned char>(128, kPoison));
}

TEST(GpuFingerprint, MatchesTheCpuAtChunkBoundariesAndAnyAlignment) {
  const std::uint64_t total = 37 * kMiB + 16;
  std::vector<unsigned char> host(total);
  std::mt19937_64 rng(400);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  DeviceBuffer device(total);
  device.upload(host);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  for (std::uint64_t shift : {0u, 3u, 8u, 12u}) {
    for (std::uint64_t n : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{15},
                            std::uint64_t{16}, std::uint64_t{17}, std::uint64_t{31},
                            std::uint64_t{32}, std::uint64_t{33}, std::uint64_t{511},
                            std::uint64_t{512}, std::uint64_t{513}, kMiB - 1, kMiB, kMiB + 1,
                            5 * kMiB + 12345, 37 * kMiB}) {
      const std::uint64_t cpu = fk::fingerprint_cpu(host.data() + shift, n, 2);
      const std::uint64_t gpu = fk::fingerprint_cuda(device.data() + shift, n, stream);
      EXPECT_EQ(gpu, cpu) << "bytes " << n << " shift " << shift;
    }
  }
  // The async form writes into device memory.
  DeviceBuffer result(8);
  fk::fingerprint_cuda_async(device.data(), total, reinterpret_cast<std::uint64_t*>(result.data()),
                             stream);
  cuda_ok(cudaStreamSynchronize(stream), "sync");
  const auto bytes = result.download();
  std::uint64_t value = 0;
  std::memcpy(&value, bytes.data(), 8);
  EXPECT_EQ(value, fk::fingerprint_cpu(host.data(), total));
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
}

// Fingerprints `ranges` (offset, bytes) of `device` in one fingerprint_many_cuda_async call and
// compares each with fingerprint_cpu of the same bytes of `host`.
void expect_many_equal_cpu(const std::vector<unsigned char>& host, const DeviceBuffer& device,
                           const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                           cudaStream_t stream) {
  std::vector<const void*> data;
  std::vector<std::uint64_t> bytes;
  for (const auto& [offset, n] : ranges) {
    data.push_back(device.data() + offset);
    bytes.push_back(n);
  }
  DeviceBuffer results(ranges.size() * 8);
  cuda_ok(cudaMemset(results.data(), 0, ranges.size() * 8), "clear results");
  fk::fingerprint_many_cuda_async(data, bytes, reinterpret_cast<std::uint64_t*>(results.data()),
                                  stream);
  data.clear();  // the call copied the ranges
  bytes.clear();
  cuda_ok(cudaStreamSynchronize(stream), "sync");
  const auto raw = results.download();
  // The CPU twin on a few threads per range, ranges spread over the host's cores.
  std::vector<std::uint64_t> expected(ranges.size());
  std::vector<std::thread> pool;
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (std::size_t i = w; i < ranges.size(); i += workers) {
        expected[i] = fk::fingerprint_cpu(host.data() + ranges[i].first, ranges[i].second, 1);
      }
    });
  }
  for (auto& t : pool) t.join();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    std::uint64_t value = 0;
    std::memcpy(&value, raw.data() + 8 * i, 8);
    if (value != expected[i] && ++wrong <= 10) {
      ADD_FAILURE() << "range " << i << ": offset " << ranges[i].first << " (shift "
                    << ranges[i].first % 16 << "), " << ranges[i].second << " bytes: GPU "
                    << std::hex << value << " CPU " << expected[i] << std::dec;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << ranges.size() << " ranges";
}

std::vector<unsigned char> random_bytes(std::uint64_t n, std::uint64_t seed) {
  std::vector<unsigned char> host(n);
  std::mt19937_64 rng(seed);
  for (std::uint64_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(host.data() + i, &v, 8);
  }
  for (std::uint64_t i = n / 8 * 8; i < n; ++i) host[i] = static_cast<unsigned char>(rng());
  return host;
}

TEST(GpuFingerprint, ManyRangesOfEverySizeAndAlignmentInOneCallMatchTheCpu) {
  const std::uint64_t sizes[] = {0, 1, 31, 32, 33, kMiB - 1, kMiB, kMiB + 7, 5 * kMiB + 3};
  const std::uint64_t total = 8 * kMiB;
  const auto host = random_bytes(total, 500);
  DeviceBuffer device(total);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  // The upload is the stream's earlier work: the fingerprints must read after it.
  cuda_ok(cudaMemset(device.data(), 0, total), "clear");
  void* pinned = nullptr;
  cuda_ok(cudaMallocHost(&pinned, total), "pinned");
  std::memcpy(pinned, host.data(), total);
  cuda_ok(cudaMemcpyAsync(device.data(), pinned, total, cudaMemcpyHostToDevice, stream), "upload");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (std::uint64_t shift = 0; shift < 16; ++shift) {
    for (std::uint64_t n : sizes)
      ranges.emplace_back(shift * 4099 % (2 * kMiB) / 16 * 16 + shift, n);
  }
  // Overlapping ranges and the same range twice are independent entries.
  ranges.emplace_back(0, total);
  ranges.emplace_back(0, total);
  ranges.emplace_back(total - 33, 33);
  expect_many_equal_cpu(host, device, ranges, stream);
  cuda_ok(cudaFreeHost(pinned), "free pinned");
  // Up to 32 ranges travel in the kernels' argument, more in a device table: both sides of it.
  for (std::size_t n : {31, 32, 33}) {
    SCOPED_TRACE(n);
    expect_many_equal_cpu(host, device, {ranges.end() - n, ranges.end()}, stream);
  }

  // A batch of one range and a batch of empty ranges only.
  expect_many_equal_cpu(host, device, {{3, 5 * kMiB + 3}}, stream);
  expect_many_equal_cpu(host, device, {{0, 0}, {5, 0}}, stream);
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
}

// Chunk hashes of pieces numbered from their first chunk in a longer range (the receiver's
// pieces of a parameter): the device's equal fingerprint_chunks_cpu's, and the pieces' hashes
// on chunk boundaries combine into the range's fingerprint.
TEST(GpuFingerprint, ChunkHashesOfPiecesNumberedInTheirRangeMatchTheCpu) {
  const std::uint64_t total = 9 * kMiB + 4000;
  const auto host = random_bytes(total, 650);
  DeviceBuffer device(total);
  device.upload(host);
  // (offset, bytes, first index): pieces on chunk boundaries, a short tail, odd shifts.
  const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> ranges = {
      {0, 3 * kMiB, 0},          {3 * kMiB, kMiB, 3},   {4 * kMiB, 5 * kMiB + 4000, 4},
      {5 * kMiB + 7, kMiB - 9, 5}, {100, 0, 2},          {123, 4096 + 5, 77}};
  std::vector<const void*> data;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> first;
  std::uint64_t chunks = 0;
  for (const auto& [offset, n, index] : ranges) {
    data.push_back(device.data() + offset);
    bytes.push_back(n);
    first.push_back(index);
    chunks += (n + kMiB - 1) / kMiB;
  }
  DeviceBuffer out(chunks * 8);
  fk::fingerprint_chunks_many_cuda_async(data, bytes, first,
                                         reinterpret_cast<std::uint64_t*>(out.data()), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "sync");
  const auto raw = out.download();
  std::vector<std::uint64_t> got(chunks);
  std::memcpy(got.data(), raw.data(), chunks * 8);
  std::vector<std::uint64_t> expected;
  for (const auto& [offset, n, index] : ranges) {
    const auto h = fk::fingerprint_chunks_cpu(host.data() + offset, n, index);
    expected.insert(expected.end(), h.begin(), h.end());
  }
  EXPECT_EQ(got, expected);
  // The first three pieces tile the range: their 10 hashes make its fingerprint.
  const std::vector<std::uint64_t> tiling(got.begin(), got.begin() + 10);
  EXPECT_EQ(fk::combine_chunk_hashes(tiling, total), fk::fingerprint_cpu(host.data(), total));
}

TEST(GpuFingerprint, FourThousandRangesFromFourKiBToFourMiBMatchTheCpu) {
  const std::uint64_t total = 64 * kMiB;
  const auto host = random_bytes(total, 600);
  DeviceBuffer device(total);
  device.upload(host);
  std::mt19937_64 rng(601);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  const double lo = std::log(4096.0);
  const double hi = std::log(4.0 * static_cast<double>(kMiB));
  std::uniform_real_distribution<double> log_size(lo, hi);
  for (int i = 0; i < 4096; ++i) {
    std::uint64_t n = static_cast<std::uint64_t>(std::exp(log_size(rng)));
    if (i == 0) n = 4096;
    if (i == 1) n = 4 * kMiB;
    if (i % 7 == 0) n = (n + kMiB - 1) / kMiB * kMiB;  // whole chunks too
    n = std::min(n, 4 * kMiB);
    const std::uint64_t offset =
        (rng() % (total - n - 16 + 1)) / 16 * 16 + (i % 4 == 0 ? 0 : rng() % 16);
    ranges.emplace_back(offset, n);
  }
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  expect_many_equal_cpu(host, device, ranges, stream);
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
}

TEST(GpuFingerprint, ManyRefusesMismatchedSpansAndNullData) {
  const std::vector<const void*> data = {nullptr, nullptr};
  const std::vector<std::uint64_t> one = {0};
  const std::vector<std::uint64_t> two = {0, 5};
  DeviceBuffer results(16);
  auto* out = reinterpret_cast<std::uint64_t*>(results.data());
  for (const auto* sizes : {&one, &two}) {
    try {
      fk::fingerprint_many_cuda_async(data, *sizes, out, nullptr);
      ADD_FAILURE() << "accepted " << sizes->size() << " sizes";
    } catch (const ferry::Error& e) {
      EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << e.what();
    }
  }
  // Null data is fine for empty ranges.
  const std::vector<std::uint64_t> empty = {0, 0};
  fk::fingerprint_many_cuda_async(data, empty, out, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "sync");
  const auto raw = results.download();
  std::uint64_t value = 0;
  std::memcpy(&value, raw.data() + 8, 8);
  EXPECT_EQ(value, 0xef46db3751d8e999ull);
}
