// The CUDA scatter kernel: one launch executes every op of a bucket's plan. Blocks take work
// units (a slice of one row of one op) in a grid-stride loop and find their op by binary search
// over the prefix sum of units; copies move 16 bytes per thread where source and destination
// share alignment, casts use the bit-exact conversions shared with the CPU twin.
#include "launch.hpp"

#include "ferry/kernels/float_bits.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/cuda_scratch.hpp>

#include <cstdint>

namespace ferry::kernels::cuda_detail {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::uint64_t kMaxBlocks = 1u << 16;

__device__ std::uint32_t find_op(const DeviceOp* ops, std::uint32_t num_ops, std::uint64_t unit) {
  std::uint32_t lo = 0, hi = num_ops - 1;  // the answer is in [lo, hi]
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo + 1) / 2;
    if (ops[mid].first_unit <= unit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ void copy_bytes(const unsigned char* src, unsigned char* dst, std::uint64_t n) {
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  std::uint64_t head = n;
  if (((s ^ d) & 15u) == 0) head = (16u - (d & 15u)) & 15u;
  if (head > n) head = n;
  for (std::uint64_t i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
  const std::uint64_t vectors = (n - head) / 16;
  const auto* s16 = reinterpret_cast<const uint4*>(src + head);
  auto* d16 = reinterpret_cast<uint4*>(dst + head);
  for (std::uint64_t i = threadIdx.x; i < vectors; i += blockDim.x) d16[i] = s16[i];
  for (std::uint64_t i = head + vectors * 16 + threadIdx.x; i < n; i += blockDim.x) {
    dst[i] = src[i];
  }
}

template <typename T>
__device__ T load(const unsigned char* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const T*>(p);
  T v;
  auto* b = reinterpret_cast<unsigned char*>(&v);
  for (unsigned i = 0; i < sizeof(T); ++i) b[i] = p[i];
  return v;
}

template <typename T>
__device__ void store(unsigned char* p, T v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<T*>(p) = v;
    return;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(&v);
  for (unsigned i = 0; i < sizeof(T); ++i) p[i] = b[i];
}

__device__ float load_f32(std::uint32_t dtype, const unsigned char* p, bool aligned) {
  switch (dtype) {
    case FERRY_DTYPE_F32: return load<float>(p, aligned);
    case FERRY_DTYPE_F16: return bits::f16_to_f32(load<std::uint16_t>(p, aligned));
    case FERRY_DTYPE_BF16: return bits::bf16_to_f32(load<std::uint16_t>(p, aligned));
    case FERRY_DTYPE_F8_E4M3: return bits::e4m3_to_f32(*p);
    default: return bits::e5m2_to_f32(*p);  // FERRY_DTYPE_F8_E5M2
  }
}

__device__ void store_from_f32(std::uint32_t dtype, unsigned char* p, float v, bool aligned) {
  switch (dtype) {
    case FERRY_DTYPE_F64: store<double>(p, static_cast<double>(v), aligned); break;
    case FERRY_DTYPE_F32: store<float>(p, v, aligned); break;
    case FERRY_DTYPE_F16: store<std::uint16_t>(p, bits::f32_to_f16(v), aligned); break;
    case FERRY_DTYPE_BF16: store<std::uint16_t>(p, bits::f32_to_bf16(v), aligned); break;
    case FERRY_DTYPE_F8_E4M3: *p = bits::f32_to_e4m3(v); break;
    default: *p = bits::f32_to_e5m2(v); break;  // FERRY_DTYPE_F8_E5M2
  }
}

__device__ void store_from_f64(std::uint32_t dtype, unsigned char* p, double v, bool aligned) {
  switch (dtype) {
    case FERRY_DTYPE_F64: store<double>(p, v, aligned); break;
    case FERRY_DTYPE_F32: store<float>(p, __double2float_rn(v), aligned); break;
    case FERRY_DTYPE_F16: store<std::uint16_t>(p, bits::f64_to_f16(v), aligned); break;
    case FERRY_DTYPE_BF16: store<std::uint16_t>(p, bits::f64_to_bf16(v), aligned); break;
    case FERRY_DTYPE_F8_E4M3: *p = bits::f64_to_e4m3(v); break;
    default: *p = bits::f64_to_e5m2(v); break;  // FERRY_DTYPE_F8_E5M2
  }
}

__device__ bool is_float(std::uint32_t dtype) {
  return dtype == FERRY_DTYPE_F64 || dtype == FERRY_DTYPE_F32 || dtype == FERRY_DTYPE_F16 ||
         dtype == FERRY_DTYPE_BF16 || dtype == FERRY_DTYPE_F8_E4M3 ||
         dtype == FERRY_DTYPE_F8_E5M2;
}

__device__ std::int64_t load_int(std::uint32_t dtype, const unsigned char* p, bool aligned) {
  switch (dtype) {
    case FERRY_DTYPE_I64: return load<std::int64_t>(p, aligned);
    case FERRY_DTYPE_I32: return load<std::int32_t>(p, aligned);
    case FERRY_DTYPE_I16: return load<std::int16_t>(p, aligned);
    case FERRY_DTYPE_I8: return static_cast<std::int8_t>(*p);
    case FERRY_DTYPE_U8: return *p;
    default: return *p != 0 ? 1 : 0;  // FERRY_DTYPE_BOOL
  }
}

__device__ void store_int(std::uint32_t dtype, unsigned char* p, std::int64_t v, bool aligned) {
  switch (dtype) {
    case FERRY_DTYPE_I64: store<std::int64_t>(p, v, aligned); break;
    case FERRY_DTYPE_I32: store<std::int32_t>(p, static_cast<std::int32_t>(v), aligned); break;
    case FERRY_DTYPE_I16: store<std::int16_t>(p, static_cast<std::int16_t>(v), aligned); break;
    default: *p = static_cast<unsigned char>(v); break;  // I8, U8, BOOL
  }
}

__device__ void cast_range(const DeviceOp& op, const unsigned char* src, unsigned char* dst,
                           std::uint64_t n) {
  const bool aligned = op.aligned != 0;
  const bool floats = is_float(op.src_dtype);
  for (std::uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned char* s = src + i * op.src_size;
    unsigned char* d = dst + i * op.dst_size;
    if (!floats) {
      store_int(op.dst_dtype, d, load_int(op.src_dtype, s, aligned), aligned);
    } else if (op.src_dtype == FERRY_DTYPE_F64) {
      store_from_f64(op.dst_dtype, d, load<double>(s, aligned), aligned);
    } else {
      store_from_f32(op.dst_dtype, d, load_f32(op.src_dtype, s, aligned), aligned);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const DeviceOp* ops, std::uint32_t num_ops, std::uint64_t total_units,
                   std::uintptr_t src_base) {
  for (std::uint64_t unit = blockIdx.x; unit < total_units; unit += gridDim.x) {
    const DeviceOp& op = ops[find_op(ops, num_ops, unit)];
    const std::uint64_t local = unit - op.first_unit;
    const std::uint64_t row = local / op.units_per_row;
    const std::uint64_t begin = (local % op.units_per_row) * op.unit_elems;
    const std::uint64_t end = begin + op.unit_elems < op.cols ? begin + op.unit_elems : op.cols;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(
                                   src_base + reinterpret_cast<std::uintptr_t>(op.src)) +
                               row * op.src_stride + begin * op.src_size;
    unsigned char* dst = op.dst + row * op.dst_stride + begin * op.dst_size;
    if (op.is_copy) {
      copy_bytes(src, dst, end - begin);
    } else {
      cast_range(op, src, dst, end - begin);
    }
  }
}

}  // namespace

cudaError_t launch_scatter(const DeviceOp* host_ops, std::size_t num_ops,
                           std::uint64_t total_units, cudaStream_t stream) {
  if (num_ops == 0 || total_units == 0) return cudaSuccess;
  DeviceOp* table = nullptr;
  const std::size_t table_bytes = num_ops * sizeof(DeviceOp);
  cudaError_t err =
      ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&table), table_bytes, stream);
  if (err != cudaSuccess) return err;
  // From pageable memory this returns once the bytes are staged, so the caller may free them.
  err = cudaMemcpyAsync(table, host_ops, table_bytes, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) err = launch_scatter_table(table, num_ops, total_units, 0, stream);
  const cudaError_t free_err = cudaFreeAsync(table, stream);
  return err != cudaSuccess ? err : free_err;
}

cudaError_t launch_scatter_table(const DeviceOp* device_ops, std::size_t num_ops,
                                 std::uint64_t total_units, std::uintptr_t src_base,
                                 cudaStream_t stream) {
  if (num_ops == 0 || total_units == 0) return cudaSuccess;
  const std::uint64_t blocks = total_units < kMaxBlocks ? total_units : kMaxBlocks;
  scatter_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      device_ops, static_cast<std::uint32_t>(num_ops), total_units, src_base);
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda_detail
