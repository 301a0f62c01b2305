// Tests of the CUDA FP8 block quantization against its CPU twin, bit for bit: random data of
// several shapes (partial blocks, all-zero blocks, infinities, NaN, values that saturate), every
// bf16 value below 448 through the conversion, ue8m0 scales, f16/f32 sources, aligned (vector)
// and misaligned (scalar) tiles, and a multi-op stacked plan. Exits 77 without a CUDA device.
#include "ferry/kernels/cpu.hpp"
#include "ferry/kernels/cuda.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace fk = ferry::kernels;

namespace {

void cuda_ok(cudaError_t err, const char* what) {
  ASSERT_EQ(err, cudaSuccess) << what << ": " << cudaGetErrorString(err);
}

// Host bytes and their device copy.
struct Twin {
  std::vector<unsigned char> host;
  void* device = nullptr;
  explicit Twin(std::vector<unsigned char> bytes) : host(std::move(bytes)) {
    cuda_ok(cudaMalloc(&device, host.size() + 64), "malloc");
    cuda_ok(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  ~Twin() { cudaFree(device); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(host.size());
    cuda_ok(cudaMemcpy(out.data(), device, host.size(), cudaMemcpyDeviceToHost), "download");
    return out;
  }
};

// A source tensor: `elements` values of `dtype` starting `shift` elements into the buffer (a
// shift that breaks 16-byte alignment sends the kernel down its scalar path).
struct Source {
  ferry_dtype_t dtype;
  std::uint64_t elements;
  std::uint64_t shift;
  std::vector<unsigned char> bytes;
};

Source random_source(ferry_dtype_t dtype, std::uint64_t rows, std::uint64_t cols,
                     std::uint64_t shift, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 24);
  const std::uint64_t n = rows * cols;
  const std::size_t size = ferry::dtype_size(dtype);
  Source s{dtype, n, shift, std::vector<unsigned char>((n + shift) * size)};
  const std::uint64_t bc = (cols + 127) / 128;
  std::vector<float> magnitude(((rows + 127) / 128) * bc);
  for (auto& m : magnitude) m = std::ldexp(1.0f, exponent(rng));
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t b = (i / cols / 128) * bc + (i % cols) / 128;
    float v = b == 1 ? 0.0f : normal(rng) * magnitude[b];
    unsigned char* p = s.bytes.data() + (shift + i) * size;
    if (dtype == FERRY_DTYPE_F32) {
      std::memcpy(p, &v, 4);
    } else if (dtype == FERRY_DTYPE_BF16) {
      const std::uint16_t h = fk::f32_to_bf16(v);
      std::memcpy(p, &h, 2);
    } else {
      const std::uint16_t h = fk::f32_to_f16(v);
      std::memcpy(p, &h, 2);
    }
  }
  // Extremes in the last block: the largest finite value, infinities, a NaN.
  auto put = [&](std::uint64_t i, float v) {
    unsigned char* p = s.bytes.data() + (shift + i) * size;
    if (dtype == FERRY_DTYPE_F32) {
      std::memcpy(p, &v, 4);
    } else {
      const std::uint16_t h = dtype == FERRY_DTYPE_BF16 ? fk::f32_to_bf16(v) : fk::f32_to_f16(v);
      std::memcpy(p, &h, 2);
    }
  };
  if (n > 8) {
    put(n - 1, dtype == FERRY_DTYPE_F16 ? 65504.0f : 3.0e38f);
    put(n - 2, -INFINITY);
    put(n - 3, NAN);
  }
  return s;
}

ferry_plan_op_t fp8_op(ferry_dtype_t src_dtype, std::uint64_t src_offset, std::uint64_t src_stride,
                       std::uint64_t dst_offset, std::uint64_t k, std::uint64_t rows,
                       std::uint64_t cols, bool ue8m0, std::uint32_t src = 0) {
  ferry_plan_op_t op{};
  op.struct_size = sizeof op;
  op.src_tensor = src;
  op.src_dtype = src_dtype;
  op.src_offset = src_offset;
  op.src_row_stride = src_stride;
  op.dst_param = 0;
  op.dst_dtype = FERRY_DTYPE_F8_E4M3;
  op.dst_offset = dst_offset;
  op.dst_row_stride = k;
  op.rows = rows;
  op.cols = cols;
  op.transform = FERRY_TRANSFORM_FP8_BLOCK_QUANT;
  op.flags = ue8m0 ? static_cast<std::uint32_t>(FERRY_OP_SCALE_UE8M0) : 0u;
  op.scale_param = 1;
  return op;
}

// Runs `ops` over `sources` into an [m, k] FP8 parameter with its scales, on the CPU and the
// GPU, and requires identical bytes.
void expect_twins_agree(const std::vector<Source>& sources, const std::vector<ferry_plan_op_t>& ops,
                        std::uint64_t m, std::uint64_t k, const std::string& what) {
  const std::uint64_t scales = ((m + 127) / 128) * ((k + 127) / 128);
  std::vector<unsigned char> q_cpu(m * k, 0xAA);
  std::vector<unsigned char> s_cpu(scales * 4, 0xAA);
  Twin q_gpu(q_cpu), s_gpu(s_cpu);
  std::vector<std::unique_ptr<Twin>> src_gpu;
  std::vector<fk::EntryView> host_entries, device_entries;
  for (const Source& s : sources) {
    src_gpu.push_back(std::make_unique<Twin>(s.bytes));
    const std::size_t off = s.shift * ferry::dtype_size(s.dtype);
    host_entries.push_back({reinterpret_cast<const std::byte*>(s.bytes.data()) + off, s.dtype, s.elements});
    device_entries.push_back(
        {static_cast<const std::byte*>(src_gpu.back()->device) + off, s.dtype, s.elements});
  }
  const std::vector<fk::ParamView> host_params = {
      {reinterpret_cast<std::byte*>(q_cpu.data()), FERRY_DTYPE_F8_E4M3, m * k},
      {reinterpret_cast<std::byte*>(s_cpu.data()), FERRY_DTYPE_F32, scales}};
  const std::vector<fk::ParamView> device_params = {
      {static_cast<std::byte*>(q_gpu.device), FERRY_DTYPE_F8_E4M3, m * k},
      {static_cast<std::byte*>(s_gpu.device), FERRY_DTYPE_F32, scales}};
  fk::fp8_block_quant_cpu(ops, host_entries, host_params, 2);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "stream");
  fk::fp8_block_quant_cuda(ops, device_entries, device_params, stream);
  cuda_ok(cudaStreamSynchronize(stream), "sync");
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
  const auto q = q_gpu.download();
  const auto s = s_gpu.download();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] != q_cpu[i] && bad++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " gpu 0x" << std::hex << int{q[i]}
                    << " cpu 0x" << int{q_cpu[i]};
    }
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_EQ(std::memcmp(s.data(), s_cpu.data(), s.size()), 0) << what << ": scales differ";
  // Nothing was left unwritten.
  for (std::size_t i = 0; i < scales; ++i) {
    float v;
    std::memcpy(&v, s_cpu.data() + 4 * i, 4);
    EXPECT_GT(v, 0.0f) << what << ": scale " << i;
  }
}

struct Case {
  ferry_dtype_t dtype;
  std::uint64_t rows, cols, shift;
  bool ue8m0;
};

TEST(Fp8Gpu, BitIdenticalToCpuOnRandomShapes) {
  const Case cases[] = {
      {FERRY_DTYPE_BF16, 128, 128, 0, false}, {FERRY_DTYPE_BF16, 1024, 768, 0, false},
      {FERRY_DTYPE_BF16, 300, 200, 0, false}, {FERRY_DTYPE_BF16, 257, 384, 0, true},
      {FERRY_DTYPE_BF16, 256, 256, 3, false}, {FERRY_DTYPE_BF16, 1, 4100, 0, false},
      {FERRY_DTYPE_BF16, 4100, 1, 0, true},   {FERRY_DTYPE_F16, 384, 260, 0, false},
      {FERRY_DTYPE_F16, 256, 512, 1, true},   {FERRY_DTYPE_F32, 300, 300, 0, false},
      {FERRY_DTYPE_F32, 128, 640, 1, true},
  };
  unsigned seed = 1;
  for (const Case& c : cases) {
    const std::string what = std::string(ferry::dtype_name(c.dtype)) + " " +
                             std::to_string(c.rows) + "x" + std::to_string(c.cols) + " shift " +
                             std::to_string(c.shift) + (c.ue8m0 ? " ue8m0" : "");
    std::vector<Source> sources = {random_source(c.dtype, c.rows, c.cols, c.shift, seed++)};
    expect_twins_agree(sources, {fp8_op(c.dtype, 0, c.cols, 0, c.cols, c.rows, c.cols, c.ue8m0)},
                       c.rows, c.cols, what);
  }
}

TEST(Fp8Gpu, EveryBf16ValueConvertsIdentically) {
  // Every finite bf16 value of magnitude <= 448, 127 to a tile row next to 448 itself, so each
  // tile's scale is exactly 1 and the conversion sees the value unchanged. Tile t repeats its
  // row 128 times; 64 tiles (sources) per call.
  std::vector<std::uint16_t> codes;
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const float v = fk::bf16_to_f32(static_cast<std::uint16_t>(c));
    if (std::isfinite(v) && std::fabs(v) <= 448.0f) codes.push_back(static_cast<std::uint16_t>(c));
  }
  const std::uint64_t tiles = (codes.size() + 126) / 127;
  const std::uint16_t max448 = fk::f32_to_bf16(448.0f);
  for (std::uint64_t t0 = 0; t0 < tiles; t0 += 64) {
    const std::uint64_t n = std::min<std::uint64_t>(64, tiles - t0);
    std::vector<Source> sources;
    std::vector<ferry_plan_op_t> ops;
    for (std::uint64_t k = 0; k < n; ++k) {
      std::uint16_t row[128];
      for (std::uint64_t c = 0; c < 127; ++c) {
        const std::uint64_t i = (t0 + k) * 127 + c;
        row[c] = i < codes.size() ? codes[i] : 0;
      }
      row[127] = max448;
      Source tile{FERRY_DTYPE_BF16, 128 * 128, 0, std::vector<unsigned char>(128 * 128 * 2)};
      for (std::uint64_t r = 0; r < 128; ++r) std::memcpy(tile.bytes.data() + r * 256, row, 256);
      sources.push_back(std::move(tile));
      ops.push_back(fp8_op(FERRY_DTYPE_BF16, 0, 128, k * 128 * 128, 128, 128, 128, false,
                           static_cast<std::uint32_t>(k)));
    }
    expect_twins_agree(sources, ops, n * 128, 128, "bf16 codes of tile " + std::to_string(t0));
  }
}

TEST(Fp8Gpu, StackedMultiOpPlanMatchesCpu) {
  // [4, 256, 384] stacked experts: per expert a gate op and an up op of 128 rows each (fused
  // parts, contiguous sources), and a row-parallel shard (strided source) for expert 3.
  std::vector<Source> sources;
  std::vector<ferry_plan_op_t> ops;
  unsigned seed = 100;
  for (std::uint32_t e = 0; e < 3; ++e) {
    sources.push_back(random_source(FERRY_DTYPE_BF16, 128, 384, 0, seed++));
    sources.push_back(random_source(FERRY_DTYPE_BF16, 128, 384, 0, seed++));
    ops.push_back(fp8_op(FERRY_DTYPE_BF16, 0, 384, (e * 256) * 384, 384, 128, 384, false, 2 * e));
    ops.push_back(
        fp8_op(FERRY_DTYPE_BF16, 0, 384, (e * 256 + 128) * 384, 384, 128, 384, false, 2 * e + 1));
  }
  sources.push_back(random_source(FERRY_DTYPE_BF16, 256, 768, 0, seed++));
  ops.push_back(fp8_op(FERRY_DTYPE_BF16, 384, 768, (3 * 256) * 384, 384, 256, 384, false, 6));
  expect_twins_agree(sources, ops, 4 * 256, 384, "stacked");
}

TEST(Fp8Gpu, BadPlanIsRefusedOnTheHost) {
  Source s = random_source(FERRY_DTYPE_BF16, 128, 128, 0, 9);
  Twin src(s.bytes), q(std::vector<unsigned char>(128 * 128)), sc(std::vector<unsigned char>(4));
  const std::vector<fk::EntryView> entries = {
      {static_cast<const std::byte*>(src.device), FERRY_DTYPE_BF16, 128 * 128}};
  const std::vector<fk::ParamView> params = {
      {static_cast<std::byte*>(q.device), FERRY_DTYPE_F8_E4M3, 128 * 128},
      {static_cast<std::byte*>(sc.device), FERRY_DTYPE_F32, 1}};
  EXPECT_THROW(fk::fp8_block_quant_cuda(std::vector{fp8_op(FERRY_DTYPE_BF16, 0, 128, 0, 128, 100,
                                                           128, false)},
                                        entries, params, nullptr),
               ferry::Error);
}

}  // namespace
