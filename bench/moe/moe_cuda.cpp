// bench/moe/moe_cuda.cpp: the CUDA measurement of `ferry bench moe` (built with the cuda
// feature): each layer's plan prepared once (prepare_scatter_cuda, as the update engine caches
// it), then every timed run applies every layer's bucket with one scatter launch each, timed with
// CUDA events; afterwards sampled experts are compared with their source bytes on the host.
#include <ferry/kernels/cuda.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bench/common/cuda.hpp"
#include "bench/common/data.hpp"
#include "bench/moe/moe.hpp"

namespace ferry::bench {

MoeMeasurement measure_moe_cuda(const MoeShape& s, const MoePlans& plans, int warmup, int repeat) {
  MoeMeasurement m;
  Watchdog::phase("allocating the CUDA moe case");
  const DeviceMemory memory = device_memory();
  const std::uint64_t layer_bytes = s.bucket_bytes();  // w13 + w2 of a layer = its bucket's bytes
  const std::uint64_t reserve = layer_bytes + (4ull << 30);
  std::uint64_t layers = s.layers;
  if (memory.free < reserve + layers * layer_bytes) {
    layers = memory.free > reserve ? (memory.free - reserve) / layer_bytes : 0;
    if (layers == 0) fail(FERRY_STATUS_OUT_OF_MEMORY, "bench moe: not even one layer fits");
    m.note = fmt::format("{} of {} layers fit in GPU memory", layers, s.layers);
  }
  m.layers = layers;
  Stream stream;
  DeviceBuffer bucket(layer_bytes, "layer bucket");
  fill_pattern_cuda(bucket.data(), layer_bytes, 11, stream.get());
  std::vector<DeviceBuffer> w13, w2;
  std::vector<kernels::ParamView> params(plans.layout_size);
  for (std::uint64_t l = 0; l < layers; ++l) {
    w13.emplace_back(layer_bytes * 2 / 3, "w13_weight");
    w2.emplace_back(layer_bytes / 3, "w2_weight");
    cuda_check(cudaMemsetAsync(w13.back().data(), kPoisonByte, w13.back().size(), stream.get()), "poison");
    cuda_check(cudaMemsetAsync(w2.back().data(), kPoisonByte, w2.back().size(), stream.get()), "poison");
    params[plans.w13[l]] = {w13.back().data(), FERRY_DTYPE_BF16, w13.back().size() / 2};
    params[plans.w2[l]] = {w2.back().data(), FERRY_DTYPE_BF16, w2.back().size() / 2};
  }
  stream.synchronize("filling the bucket and poisoning the parameters");
  const auto entries = moe_entries(s, bucket.data());
  Watchdog::phase("preparing the layer plans");
  std::vector<std::shared_ptr<const kernels::PreparedScatter>> prepared;
  for (std::uint64_t l = 0; l < layers; ++l) {
    prepared.push_back(kernels::prepare_scatter_cuda(plans.ops[l], entries, bucket.data(), params));
  }
  Event start, end;
  Watchdog::phase("running the per-layer scatters");
  for (int i = 0; i < warmup + repeat; ++i) {
    start.record(stream.get());
    for (std::uint64_t l = 0; l < layers; ++l) {
      kernels::scatter_cuda(*prepared[l], bucket.data(), stream.get());
    }
    end.record(stream.get());
    const double t = elapsed_seconds(start, end);
    if (i >= warmup) m.ferry_s.push_back(t);
  }
  Watchdog::phase("verifying sampled experts");
  std::vector<unsigned char> host(layer_bytes);
  cuda_check(cudaMemcpy(host.data(), bucket.data(), layer_bytes, cudaMemcpyDeviceToHost), "bucket");
  const std::uint64_t t = s.tensor_elements() * 2;
  std::vector<unsigned char> got(t);
  std::uint64_t checked = 0, bad = 0;
  for (std::uint64_t l : {std::uint64_t{0}, layers - 1}) {
    for (std::uint64_t e : {std::uint64_t{0}, s.experts / 2, s.experts - 1}) {
      for (int part = 0; part < 3; ++part) {
        const std::byte* where = part < 2 ? w13[l].data() + (2 * e + part) * t : w2[l].data() + e * t;
        cuda_check(cudaMemcpy(got.data(), where, t, cudaMemcpyDeviceToHost), "expert readback");
        ++checked;
        if (std::memcmp(got.data(), host.data() + (3 * e + part) * t, t) != 0) ++bad;
      }
    }
  }
  m.verified = bad == 0;
  m.verification = fmt::format("{} of {} sampled expert tensors byte-equal to their source in "
                               "their stacked slot",
                               checked - bad, checked);
  return m;
}

}  // namespace ferry::bench
