// The CUDA FP8 e4m3 128x128 block quantization kernel: one thread block per tile; the tile is
// loaded into registers once (16-byte vector loads where the layout allows), reduced to its
// amax and scale, and written once as e4m3 (8-byte stores), bit-identical to the CPU twin
// (kernels/cpu/fp8.cpp) through the shared arithmetic of ferry/kernels/fp8_block.hpp. The vector
// path divides without a division instruction (reciprocal, two exact fma corrections), which
// gives the correctly rounded quotient the twin's IEEE division gives.
#include "../cpu/fp8_jobs.hpp"
#include "ferry/kernels/fp8_block.hpp"

#include <ferry/plugin.h>
#include <ferry/sdk/cuda_scratch.hpp>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::kernels::fp8_detail {

cudaError_t launch_fp8(const Fp8Job* host_jobs, std::size_t num_jobs, std::uint64_t total_tiles,
                       cudaStream_t stream);

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kPerThread = 64;  // 128 * 128 / 256 elements of the tile per thread
constexpr std::uint64_t kMaxBlocks = 1u << 20;

__device__ std::uint32_t find_job(const Fp8Job* jobs, std::uint32_t n, std::uint64_t tile) {
  std::uint32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo + 1) / 2;
    if (jobs[mid].first_tile <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// e4m3 of w / s: the hardware conversion (RNE, saturating to +-448) where it exists and the
// value is a number; the shared software routine otherwise (it keeps a NaN's sign).
__device__ __forceinline__ std::uint8_t quantize_fast(float w, float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float q = __fdiv_rn(w, s);
  if (q != q) return fp8::nan_code(w);
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
#else
  return fp8::quantize(w, s);
#endif
}

// w / s correctly rounded (the bits __fdiv_rn gives) from r = RN(1 / s), without a division:
// q0 = RN(w * r) is within 2 ulp of w / s, one residual correction brings it within 1 ulp, and
// a second one makes it the correctly rounded quotient (Markstein: with r the correctly rounded
// reciprocal and q within 1 ulp, r' = w - s*q is exact in an fma and RN(q + r'*r) = RN(w / s)).
// Preconditions, which a tile with a finite scale meets: s is finite with 1/s a normal float
// and |w| <= 449 * s, so no step overflows. The residual can only lose bits below 2^-100 in
// |w|, where every quotient (|w / s| < 2^-77, as s >= 2^-23) and every approximation of it is
// far below half the smallest e4m3 subnormal (2^-10); copysign keeps w's sign there and for
// w = -0 (the corrections turn -0 into +0), so the e4m3 code (+-0) is the same.
// Checked against IEEE division on 147M (w, s) pairs, every bf16 value included
// (docs/benchmarks.md); the GPU tests compare whole tiles with the CPU twin.
__device__ __forceinline__ float quotient(float w, float s, float r) {
  float q = __fmul_rn(w, r);
  float e = __fmaf_rn(-s, q, w);
  q = __fmaf_rn(e, r, q);
  e = __fmaf_rn(-s, q, w);
  q = __fmaf_rn(e, r, q);
  return copysignf(q, w);
}

// Two e4m3 codes (low byte: `lo`) of the quotients of numbers (a NaN w takes the scalar routine).
__device__ __forceinline__ std::uint32_t quantize_pair(float lo, float hi, float s, float r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<std::uint32_t>(__nv_cvt_float2_to_fp8x2(
      make_float2(quotient(lo, s, r), quotient(hi, s, r)), __NV_SATFINITE, __NV_E4M3));
#else
  const float qlo = quotient(lo, s, r), qhi = quotient(hi, s, r);
  const std::uint32_t a = qlo != qlo ? fp8::nan_code(lo) : bits::f32_to_e4m3(qlo);
  const std::uint32_t b = qhi != qhi ? fp8::nan_code(hi) : bits::f32_to_e4m3(qhi);
  return a | (b << 8);
#endif
}

__device__ __forceinline__ float load_elem(std::uint32_t dtype, const unsigned char* p) {
  if (dtype == FERRY_DTYPE_BF16) return bits::bf16_to_f32(*reinterpret_cast<const std::uint16_t*>(p));
  if (dtype == FERRY_DTYPE_F16) return bits::f16_to_f32(*reinterpret_cast<const std::uint16_t*>(p));
  return *reinterpret_cast<const float*>(p);
}

__device__ __forceinline__ float half_to_f32(std::uint32_t dtype, std::uint16_t v) {
  return dtype == FERRY_DTYPE_BF16 ? bits::bf16_to_f32(v) : bits::f16_to_f32(v);
}

// Block-wide amax (no NaN reaches here: fold_amax never returns one).
__device__ float block_amax(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  const unsigned warp = threadIdx.x / 32;
  if ((threadIdx.x & 31u) == 0) shared[warp] = v;
  __syncthreads();
  float m = shared[0];
  for (unsigned w = 1; w < kThreads / 32; ++w) m = shared[w] > m ? shared[w] : m;
  return m;
}

// At least 4 resident blocks per SM (at most 64 registers per thread, no spills): the load and
// the convert phases of one tile overlap with other tiles'. On the H200: 3 blocks 74.6% of the
// copy roofline, 4 blocks 80.2%, 5 blocks 85.9% with small spills (docs/benchmarks.md).
__global__ void __launch_bounds__(kThreads, 4)
    fp8_kernel(const Fp8Job* jobs, std::uint32_t num_jobs, std::uint64_t total_tiles) {
  __shared__ float warp_max[kThreads / 32];
  for (std::uint64_t tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const Fp8Job job = jobs[find_job(jobs, num_jobs, tile)];
    const std::uint64_t local = tile - job.first_tile;
    const std::uint64_t tr = local / job.tile_cols;
    const std::uint64_t tc = local % job.tile_cols;
    const std::uint64_t r0 = tr * fp8::kBlock;
    const std::uint64_t c0 = tc * fp8::kBlock;
    const std::uint64_t nr = job.rows - r0 < fp8::kBlock ? job.rows - r0 : fp8::kBlock;
    const std::uint64_t nc = job.cols - c0 < fp8::kBlock ? job.cols - c0 : fp8::kBlock;
    const std::uint64_t size = job.src_dtype == FERRY_DTYPE_F32 ? 4 : 2;
    const unsigned char* src = job.src + (r0 * job.src_stride + c0) * size;
    unsigned char* dst = job.dst + r0 * job.dst_stride + c0;
    const bool vec = size == 2 && nc == fp8::kBlock &&
                     (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0 &&
                     ((job.src_stride * 2) & 15u) == 0 &&
                     (reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0 && (job.dst_stride & 7u) == 0;
    // On the vector path the tile stays in registers between the two passes (raw 16-bit pairs,
    // 32 registers); the scalar path (misaligned or partial tiles, f32) reads it twice, the
    // second time from the cache, which keeps the kernel free of register spills.
    uint4 raw[kPerThread / 8];
    float amax = 0.0f;
    bool has_nan = false;  // vector path: a NaN among this thread's values
    if (vec) {
      // 8 vectors of 8 elements per thread: vector i is row i / 16, columns (i % 16) * 8 + [0, 8).
#pragma unroll
      for (unsigned k = 0; k < kPerThread / 8; ++k) {
        const unsigned i = threadIdx.x + k * kThreads;
        const unsigned r = i / 16;
        const unsigned c = (i % 16) * 8;
        raw[k] = make_uint4(0, 0, 0, 0);
        if (r < nr) raw[k] = *reinterpret_cast<const uint4*>(src + (r * job.src_stride + c) * 2);
      }
      // Magnitudes as 16-bit integers: for bf16 and f16 their order is the order of the values
      // and every NaN lies above infinity, so one unsigned max per pair finds the largest
      // magnitude or reveals a NaN among this thread's values (then the exact fold runs).
      std::uint32_t pair_max = 0;
#pragma unroll
      for (unsigned k = 0; k < kPerThread / 8; ++k) {
        pair_max = __vmaxu2(pair_max, raw[k].x & 0x7fff7fffu);
        pair_max = __vmaxu2(pair_max, raw[k].y & 0x7fff7fffu);
        pair_max = __vmaxu2(pair_max, raw[k].z & 0x7fff7fffu);
        pair_max = __vmaxu2(pair_max, raw[k].w & 0x7fff7fffu);
      }
      const std::uint32_t top = max(pair_max & 0xffffu, pair_max >> 16);
      has_nan = top > (job.src_dtype == FERRY_DTYPE_BF16 ? 0x7f80u : 0x7c00u);
      if (!has_nan) {
        amax = half_to_f32(job.src_dtype, static_cast<std::uint16_t>(top));
      } else {
#pragma unroll
        for (unsigned k = 0; k < kPerThread / 8; ++k) {
          const std::uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
          for (unsigned e = 0; e < 4; ++e) {
            amax = fp8::fold_amax(amax, half_to_f32(job.src_dtype, static_cast<std::uint16_t>(w[e] & 0xffffu)));
            amax = fp8::fold_amax(amax, half_to_f32(job.src_dtype, static_cast<std::uint16_t>(w[e] >> 16)));
          }
        }
      }
    } else {
#pragma unroll
      for (unsigned k = 0; k < kPerThread; ++k) {
        const unsigned i = threadIdx.x + k * kThreads;
        const unsigned r = i / 128;
        const unsigned c = i % 128;
        if (r < nr && c < nc) {
          amax = fp8::fold_amax(amax, load_elem(job.src_dtype, src + (r * job.src_stride + c) * size));
        }
      }
    }
    const float s = fp8::block_scale(block_amax(amax, warp_max), job.ue8m0 != 0);
    if (threadIdx.x == 0) job.scales[tr * job.scale_stride + tc] = s;
    if (vec) {
      // The division-free quotient needs a finite scale (an infinite one comes only from an
      // infinite amax) and is exact there (see quotient()); a thread with a NaN among its values
      // takes the scalar routine, which gives each NaN w's sign.
      const bool fast = isfinite(s) && !has_nan;
      const float recip = __frcp_rn(s);
      const bool bf16 = job.src_dtype == FERRY_DTYPE_BF16;  // else f16, widened in hardware (exact)
#pragma unroll
      for (unsigned k = 0; k < kPerThread / 8; ++k) {
        const unsigned i = threadIdx.x + k * kThreads;
        const unsigned r = i / 16;
        const unsigned c = (i % 16) * 8;
        if (r < nr) {
          const std::uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
          std::uint32_t out[2] = {0, 0};
          if (fast && bf16) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
              out[e / 2] |= quantize_pair(__uint_as_float(w[e] << 16), __uint_as_float(w[e] & 0xffff0000u),
                                          s, recip)
                            << (16 * (e % 2));
            }
          } else if (fast) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
              const float lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w[e] & 0xffffu)));
              const float hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w[e] >> 16)));
              out[e / 2] |= quantize_pair(lo, hi, s, recip) << (16 * (e % 2));
            }
          } else {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
              const std::uint32_t a = quantize_fast(
                  half_to_f32(job.src_dtype, static_cast<std::uint16_t>(w[e] & 0xffffu)), s);
              const std::uint32_t b = quantize_fast(
                  half_to_f32(job.src_dtype, static_cast<std::uint16_t>(w[e] >> 16)), s);
              out[e / 2] |= (a | (b << 8)) << (16 * (e % 2));
            }
          }
          const std::uint32_t lo = out[0], hi = out[1];
          *reinterpret_cast<uint2*>(dst + r * job.dst_stride + c) = make_uint2(lo, hi);
        }
      }
    } else {
#pragma unroll
      for (unsigned k = 0; k < kPerThread; ++k) {
        const unsigned i = threadIdx.x + k * kThreads;
        const unsigned r = i / 128;
        const unsigned c = i % 128;
        if (r < nr && c < nc) {
          dst[r * job.dst_stride + c] =
              quantize_fast(load_elem(job.src_dtype, src + (r * job.src_stride + c) * size), s);
        }
      }
    }
    __syncthreads();  // warp_max is reused by the next tile
  }
}

}  // namespace

cudaError_t launch_fp8(const Fp8Job* host_jobs, std::size_t num_jobs, std::uint64_t total_tiles,
                       cudaStream_t stream) {
  if (num_jobs == 0 || total_tiles == 0) return cudaSuccess;
  Fp8Job* table = nullptr;
  const std::size_t bytes = num_jobs * sizeof(Fp8Job);
  cudaError_t err =
      ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&table), bytes, stream);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(table, host_jobs, bytes, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) {
    const std::uint64_t blocks = total_tiles < kMaxBlocks ? total_tiles : kMaxBlocks;
    fp8_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        table, static_cast<std::uint32_t>(num_jobs), total_tiles);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(table, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace ferry::kernels::fp8_detail
