// Tests of the cuda_ipc plugin's batched copy kernels (plugins/cuda_ipc/batch_copy.cu) on a real
// device: every byte of every op lands, nothing outside the ops is touched, whatever the sizes
// (0, 1, odd, many MiB) and the alignments of source and destination (equal or not); the
// fingerprinted copy's results equal fingerprint_cpu (xxh64-interleaved-v1) of each op's bytes; a
// batch larger than kMaxCopyOps is refused. Exits 77 (skip) without a CUDA device.
#include "batch_copy.hpp"
#include "ferry/kernels/cpu.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace ferry::cuda_ipc {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr std::uint64_t kMiB = 1ull << 20;

struct Case {
  std::uint64_t src_offset = 0;
  std::uint64_t dst_offset = 0;
  std::uint64_t bytes = 0;
};

enum class Launch { kCopy, kFingerprintedCopy };

// A device buffer freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::uint64_t bytes) {
    if (cudaMalloc(&data_, bytes) != cudaSuccess) data_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
};

// Runs `cases` as one batch from a random source buffer into a poisoned destination buffer and
// checks the destination byte for byte against what the copies must produce; the fingerprinted
// copy's results must equal fingerprint_cpu of each op's source bytes. Destination ranges must
// not overlap (sources may).
void run_batch(const std::vector<Case>& cases, Launch launch) {
  std::uint64_t src_bytes = 64;
  std::uint64_t dst_bytes = 64;
  for (const auto& c : cases) {
    src_bytes = std::max(src_bytes, c.src_offset + c.bytes + 64);
    dst_bytes = std::max(dst_bytes, c.dst_offset + c.bytes + 64);
  }
  std::vector<unsigned char> source(src_bytes);
  std::mt19937_64 rng(cases.size() * 131 + src_bytes);
  for (auto& b : source) b = static_cast<unsigned char>(rng());
  std::vector<unsigned char> expected(dst_bytes, 0xEE);
  DeviceBuffer src(src_bytes);
  DeviceBuffer dst(dst_bytes);
  DeviceBuffer results(std::max<std::size_t>(cases.size(), 1) * sizeof(std::uint64_t));
  ASSERT_NE(src.get(), nullptr);
  ASSERT_NE(dst.get(), nullptr);
  ASSERT_NE(results.get(), nullptr);
  ASSERT_CUDA(cudaMemcpy(src.get(), source.data(), src_bytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dst.get(), 0xEE, dst_bytes));
  ASSERT_CUDA(cudaMemset(results.get(), 0xAB, cases.size() * sizeof(std::uint64_t)));
  std::vector<CopyOp> ops;
  for (const auto& c : cases) {
    ops.push_back({src.get() + c.src_offset, dst.get() + c.dst_offset, c.bytes});
    std::memcpy(expected.data() + c.dst_offset, source.data() + c.src_offset, c.bytes);
  }
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaDeviceSynchronize());
  auto* device_results = reinterpret_cast<std::uint64_t*>(results.get());
  if (launch == Launch::kCopy) {
    ASSERT_CUDA(launch_batch_copy(ops.data(), ops.size(), stream));
  } else {
    // The op table's staging: page-locked, and poisoned to show it is rewritten.
    void* staging = nullptr;
    const std::size_t staging_bytes = std::max<std::size_t>(
        fingerprinted_copy_staging_bytes(ops.size()), 1);
    ASSERT_CUDA(cudaMallocHost(&staging, staging_bytes));
    std::memset(staging, 0xCD, staging_bytes);
    EXPECT_EQ(launch_fingerprinted_copy(ops.data(), ops.size(), device_results, nullptr, stream),
              ops.empty() ? cudaSuccess : cudaErrorInvalidValue);
    const cudaError_t launched =
        launch_fingerprinted_copy(ops.data(), ops.size(), device_results, staging, stream);
    const cudaError_t done = cudaStreamSynchronize(stream);
    ASSERT_CUDA(cudaFreeHost(staging));
    ASSERT_CUDA(launched);
    ASSERT_CUDA(done);
  }
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  ASSERT_CUDA(cudaStreamDestroy(stream));
  std::vector<unsigned char> got(dst_bytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), dst.get(), dst_bytes, cudaMemcpyDeviceToHost));
  if (got != expected) {
    const auto diff = std::mismatch(got.begin(), got.end(), expected.begin());
    FAIL() << "destination byte " << (diff.first - got.begin()) << " is "
           << static_cast<int>(*diff.first) << ", expected " << static_cast<int>(*diff.second);
  }
  if (launch == Launch::kCopy) return;
  std::vector<std::uint64_t> fingerprints(cases.size());
  ASSERT_CUDA(cudaMemcpy(fingerprints.data(), device_results,
                         cases.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    EXPECT_EQ(fingerprints[i], ferry::kernels::fingerprint_cpu(source.data() + c.src_offset,
                                                                c.bytes, 0))
        << "op " << i << ": " << c.bytes << " bytes, source offset " << c.src_offset
        << ", destination offset " << c.dst_offset;
  }
}

// Every size of `sizes` with every (source, destination) misalignment of `alignments`, laid out
// one after the other in the destination (64 bytes apart) and read from one source buffer.
std::vector<Case> size_alignment_cases(
    const std::vector<std::uint64_t>& sizes,
    const std::vector<std::pair<unsigned, unsigned>>& alignments) {
  std::vector<Case> cases;
  std::uint64_t cursor = 0;
  for (const auto& [src_mis, dst_mis] : alignments) {
    for (const std::uint64_t bytes : sizes) {
      Case c;
      c.bytes = bytes;
      c.src_offset = 4096 * (cases.size() % 7) + src_mis;
      c.dst_offset = cursor + dst_mis;
      cursor = (c.dst_offset + bytes + 64 + 63) / 64 * 64;
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(BatchCopy, EverySizeAndAlignmentLandsAndNothingElseIsTouched) {
  // Destination ranges do not overlap; source and destination alignments equal and unequal.
  run_batch({{0, 0, 0},
             {0, 64, 1},
             {1, 129, 17},
             {3, 261, 100},
             {0, 4096, 65536},
             {7, 1 << 20, (1 << 20) + 9},
             {2, (3 << 20) + 9, 65537},
             {16, 4 << 20, 4 << 20}},
            Launch::kCopy);
}

TEST(BatchCopy, FiveHundredSmallCopiesInOneLaunch) {
  std::vector<Case> cases;
  std::mt19937_64 rng(5);
  std::uint64_t cursor = 0;
  for (int i = 0; i < 500; ++i) {
    Case c;
    c.bytes = rng() % 5000;
    c.src_offset = rng() % (1 << 20);
    c.dst_offset = cursor + rng() % 16;
    cursor = c.dst_offset + c.bytes;
    cases.push_back(c);
  }
  run_batch(cases, Launch::kCopy);
}

// Sizes around the unit (16 bytes), row (512 bytes) and chunk (1 MiB) boundaries of
// xxh64-interleaved-v1, and XXH64's stripe (32 bytes).
const std::vector<std::uint64_t> kFingerprintSizes = {
    0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 100, 511, 512, 513, 527, 528, 4095, 4096, 4097,
    kMiB - 1, kMiB, kMiB + 7, 2 * kMiB + 32, 5 * kMiB + 3};

TEST(FingerprintedCopy, EverySizeWithEqualAlignmentsLandsAndHashesLikeTheCpu) {
  run_batch(size_alignment_cases(kFingerprintSizes, {{0, 0}, {3, 3}, {4, 4}, {7, 7}, {8, 8},
                                                     {12, 12}}),
            Launch::kFingerprintedCopy);
}

TEST(FingerprintedCopy, EverySizeWithUnequalAlignmentsLandsAndHashesLikeTheCpu) {
  // Sources off 16-byte boundaries (by less and by more than 8 bytes, and by 8) into aligned
  // destinations; aligned sources into destinations 8 bytes past a 16-byte boundary (8-byte
  // stores) and off 8-byte boundaries (byte stores); both off by different amounts.
  run_batch(size_alignment_cases(kFingerprintSizes, {{5, 0}, {1, 0}, {8, 0}, {13, 0}, {0, 3},
                                                     {0, 4}, {0, 8}, {2, 7}, {9, 8}}),
            Launch::kFingerprintedCopy);
}

TEST(FingerprintedCopy, ThreeThousandOpsOfMixedSizesInOneLaunch) {
  // Mostly small ops, every 50th spanning several chunks and every 37th empty, so chunks find
  // their op among neighbours of every kind; more ops than a kernel parameter table holds.
  std::vector<Case> cases;
  std::mt19937_64 rng(11);
  std::uint64_t cursor = 0;
  for (int i = 0; i < 3000; ++i) {
    Case c;
    c.bytes = rng() % 5000;
    if (i % 50 == 0) c.bytes = kMiB + rng() % (3 * kMiB);
    if (i % 37 == 0) c.bytes = 0;
    c.src_offset = rng() % kMiB;
    c.dst_offset = cursor + rng() % 16;
    cursor = c.dst_offset + c.bytes;
    cases.push_back(c);
  }
  run_batch(cases, Launch::kFingerprintedCopy);
}

TEST(FingerprintedCopy, SixtyFourMiBOpsLandAndHashLikeTheCpu) {
  run_batch({{0, 0, 64 * kMiB}, {5, 64 * kMiB + 64, 64 * kMiB + 1}}, Launch::kFingerprintedCopy);
}

TEST(FingerprintedCopy, EmptyOpsGetTheFingerprintOfNoBytes) {
  // docs/fingerprint.md: L = 0 gives XXH64(empty, seed = 0).
  EXPECT_EQ(ferry::kernels::fingerprint_cpu(nullptr, 0, 1), 0xef46db3751d8e999ull);
  run_batch({{0, 0, 0}, {3, 8, 0}, {0, 64, 0}}, Launch::kFingerprintedCopy);
}

TEST(FingerprintedCopy, NoOpsEnqueueNothingAndNoResultsOrStagingAreRefused) {
  std::vector<CopyOp> ops(4);
  DeviceBuffer results(sizeof(std::uint64_t) * ops.size());
  ASSERT_NE(results.get(), nullptr);
  auto* device_results = reinterpret_cast<std::uint64_t*>(results.get());
  std::vector<std::uint64_t> staging(fingerprinted_copy_staging_bytes(ops.size()) / 8 + 1);
  EXPECT_EQ(launch_fingerprinted_copy(ops.data(), 1, nullptr, staging.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_fingerprinted_copy(ops.data(), 1, device_results, nullptr, nullptr),
            cudaErrorInvalidValue);
  ASSERT_CUDA(cudaMemset(results.get(), 0xAB, sizeof(std::uint64_t)));
  EXPECT_EQ(launch_fingerprinted_copy(ops.data(), 0, device_results, nullptr, nullptr),
            cudaSuccess);
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::uint64_t untouched = 0;
  ASSERT_CUDA(cudaMemcpy(&untouched, device_results, sizeof untouched, cudaMemcpyDeviceToHost));
  EXPECT_EQ(untouched, 0xABABABABABABABABull);
}

TEST(BatchCopy, MoreOpsThanOneLaunchCarriesAreRefused) {
  std::vector<CopyOp> ops(kMaxCopyOps + 1);
  EXPECT_EQ(launch_batch_copy(ops.data(), ops.size(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_batch_copy(ops.data(), 0, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace ferry::cuda_ipc
