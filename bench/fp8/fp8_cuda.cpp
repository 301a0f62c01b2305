// bench/fp8/fp8_cuda.cpp: the CUDA measurement of `ferry bench fp8` (built with the cuda feature):
// fp8_block_quant_cuda over every matrix in one call against one flat cudaMemcpyAsync D2D of the
// bf16 bytes, timed with CUDA events; then a sample of matrices (codes and scales) compared byte
// by byte with the CPU twin on the host.
#include <ferry/kernels/cuda.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "bench/common/cuda.hpp"
#include "bench/fp8/fp8.hpp"

namespace ferry::bench {

Fp8Measurement measure_fp8_cuda(Fp8Layout l, int warmup, int repeat) {
  Fp8Measurement m;
  Watchdog::phase("allocating the CUDA fp8 case");
  const DeviceMemory memory = device_memory();
  const std::uint64_t per = l.elements() * 2 * 2 + l.elements() + l.scales() * 4;  // bucket, copy, q, s
  const std::uint64_t usable = memory.free > (2ull << 30) ? memory.free - (2ull << 30) : 0;
  if (l.count > usable / per) {
    const std::uint64_t fits = std::max<std::uint64_t>(1, usable / per);
    m.note = fmt::format("scaled down from {} to {} matrices to fit the GPU", l.count, fits);
    l = make_fp8_layout(fits, l.rows, l.cols);
  }
  m.count = l.count;
  Stream stream;
  DeviceBuffer bucket(l.count * l.elements() * 2, "bf16 bucket");
  DeviceBuffer copy(l.count * l.elements() * 2, "flat copy destination");
  DeviceBuffer q(l.count * l.elements(), "fp8 weights");
  DeviceBuffer scales(l.count * l.scales() * 4, "fp8 scales");
  // Each matrix gets its own deterministic source (a few distinct patterns, cycled).
  constexpr std::uint64_t kPatterns = 4;
  std::vector<std::vector<std::uint16_t>> patterns;
  for (std::uint64_t p = 0; p < kPatterns; ++p) patterns.push_back(fp8_source_pattern(l.elements(), 42 + p));
  for (std::uint64_t i = 0; i < l.count; ++i) {
    cuda_check(cudaMemcpy(bucket.data() + i * l.elements() * 2, patterns[i % kPatterns].data(),
                          l.elements() * 2, cudaMemcpyHostToDevice),
               "uploading a source matrix");
  }
  const auto entries = fp8_entries(l, bucket.data());
  const auto params = fp8_params(l, q.data(), scales.data());
  Event start, end;
  Watchdog::phase("running fp8_block_quant_cuda");
  for (int i = 0; i < warmup; ++i) kernels::fp8_block_quant_cuda(l.ops, entries, params, stream.get());
  stream.synchronize("the warm-up quantizations");
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    kernels::fp8_block_quant_cuda(l.ops, entries, params, stream.get());
    end.record(stream.get());
    m.ferry_s.push_back(elapsed_seconds(start, end));
  }
  Watchdog::phase("running the flat D2D copy");
  for (int i = 0; i < warmup + repeat; ++i) {
    start.record(stream.get());
    cuda_check(cudaMemcpyAsync(copy.data(), bucket.data(), l.count * l.elements() * 2,
                               cudaMemcpyDeviceToDevice, stream.get()),
               "the flat copy");
    end.record(stream.get());
    const double s = elapsed_seconds(start, end);
    if (i >= warmup) m.copy_s.push_back(s);
  }
  Watchdog::phase("verifying against the CPU twin");
  std::uint64_t checked = 0, bad = 0;
  for (std::uint64_t i : {std::uint64_t{0}, l.count / 2, l.count - 1}) {
    std::vector<std::uint8_t> got_q(l.elements()), want_q(l.elements());
    std::vector<float> got_s(l.scales()), want_s(l.scales());
    cuda_check(cudaMemcpy(got_q.data(), q.data() + i * l.elements(), l.elements(),
                          cudaMemcpyDeviceToHost), "reading back codes");
    cuda_check(cudaMemcpy(got_s.data(), scales.data() + i * l.scales() * 4, l.scales() * 4,
                          cudaMemcpyDeviceToHost), "reading back scales");
    const auto& src = patterns[i % kPatterns];
    ferry_plan_op_t op = l.ops[0];
    op.dst_param = 0;
    op.scale_param = 1;
    const std::vector<kernels::EntryView> e = {
        {reinterpret_cast<const std::byte*>(src.data()), FERRY_DTYPE_BF16, l.elements()}};
    const std::vector<kernels::ParamView> p = {
        {reinterpret_cast<std::byte*>(want_q.data()), FERRY_DTYPE_F8_E4M3, l.elements()},
        {reinterpret_cast<std::byte*>(want_s.data()), FERRY_DTYPE_F32, l.scales()}};
    kernels::fp8_block_quant_cpu(std::vector{op}, e, p);
    ++checked;
    if (got_q != want_q || std::memcmp(got_s.data(), want_s.data(), l.scales() * 4) != 0) ++bad;
  }
  m.verified = bad == 0;
  m.verification = fmt::format("{} of {} sampled matrices (codes and scales) byte-identical to the "
                               "CPU twin",
                               checked - bad, checked);
  return m;
}

}  // namespace ferry::bench
