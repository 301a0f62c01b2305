// Tests of the cuda_ipc plugin's batched copy kernel (plugins/cuda_ipc/batch_copy.cu) on a real
// device: every byte of every op lands, nothing outside the ops is touched, whatever the sizes
// (0, 1, odd, many MiB) and the alignments of source and destination (equal or not); a batch
// larger than kMaxCopyOps is refused. Exits 77 (skip) without a CUDA device.
#include "batch_copy.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace ferry::cuda_ipc {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Case {
  std::uint64_t src_offset = 0;
  std::uint64_t dst_offset = 0;
  std::uint64_t bytes = 0;
};

// Runs `cases` as one batch from a random source buffer into a poisoned destination buffer and
// checks the destination byte for byte against what the copies must produce.
void run_batch(const std::vector<Case>& cases, std::uint64_t buffer_bytes) {
  std::vector<unsigned char> source(buffer_bytes);
  std::mt19937_64 rng(cases.size() * 131 + buffer_bytes);
  for (auto& b : source) b = static_cast<unsigned char>(rng());
  std::vector<unsigned char> expected(buffer_bytes, 0xEE);
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_CUDA(cudaMalloc(&src, buffer_bytes));
  ASSERT_CUDA(cudaMalloc(&dst, buffer_bytes));
  ASSERT_CUDA(cudaMemcpy(src, source.data(), buffer_bytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dst, 0xEE, buffer_bytes));
  std::vector<CopyOp> ops;
  for (const auto& c : cases) {
    ops.push_back({static_cast<unsigned char*>(src) + c.src_offset,
                   static_cast<unsigned char*>(dst) + c.dst_offset, c.bytes});
    std::memcpy(expected.data() + c.dst_offset, source.data() + c.src_offset, c.bytes);
  }
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(launch_batch_copy(ops.data(), ops.size(), stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<unsigned char> got(buffer_bytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), dst, buffer_bytes, cudaMemcpyDeviceToHost));
  for (std::uint64_t i = 0; i < buffer_bytes; ++i) {
    ASSERT_EQ(got[i], expected[i]) << "byte " << i;
  }
  ASSERT_CUDA(cudaStreamDestroy(stream));
  ASSERT_CUDA(cudaFree(src));
  ASSERT_CUDA(cudaFree(dst));
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
            (9 << 20) + 64);
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
  run_batch(cases, std::max<std::uint64_t>(cursor, (1 << 20) + 5000) + 64);
}

TEST(BatchCopy, MoreOpsThanOneLaunchCarriesAreRefused) {
  std::vector<CopyOp> ops(kMaxCopyOps + 1);
  EXPECT_EQ(launch_batch_copy(ops.data(), ops.size(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_batch_copy(ops.data(), 0, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace ferry::cuda_ipc

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: the batched copy kernel needs a CUDA device (none visible)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
