// bench/cuda_ipc/copy_variants.cu: `ferry-copy-variants`, a GPU experiment behind
// docs/benchmarks.md ("The fingerprinting copy on real-model sizes"): the production
// fingerprinting copy (plugins/cuda_ipc/batch_copy.cu, xxh64-chunked-v1 in the same pass) against
// variants of it and against one cudaMemcpy of the same bytes (the D2D ceiling), over the tensor
// sizes of Qwen3-8B (5 and 36 layers) and 256 x 64 MiB. Each variant's fingerprints are checked
// against the production kernel's and its bytes against the source. Variants: ring depth; the L2
// prefetch hint; explicit prefetch; streaming stores; the same access pattern copying only or
// hashing only (which side limits); two threads per chunk with 16-byte words; chunks staged
// through shared memory by bulk (TMA) loads and stores, persistent. Prints a table per case and
// writes JSON lines to the file named by its first argument, if any. Built with the cuda feature
// (bench/meson.build); not part of `ferry bench`: the kernels here are experiments, not ferry's.
#include "ferry/sdk/xxh64.hpp"
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>
#include <cstring>
namespace xxh64 = ferry::sdk::xxh64;
constexpr std::uint64_t C = 1ull << 20;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

struct Op { const unsigned char* src; unsigned char* dst; std::uint64_t bytes; std::uint64_t first_chunk; };
struct Batch { const Op* ops; std::uint64_t n; std::uint64_t chunks; std::uint64_t* hashes; std::uint64_t* results; };

template <int Hint> __device__ __forceinline__ unsigned long long ld(const unsigned long long* p) {
  unsigned long long v;
  if (Hint == 128) asm volatile("ld.global.nc.L2::128B.u64 %0, [%1];" : "=l"(v) : "l"(p));
  else if (Hint == 256) asm volatile("ld.global.nc.L2::256B.u64 %0, [%1];" : "=l"(v) : "l"(p));
  else if (Hint == 64) asm volatile("ld.global.nc.L2::64B.u64 %0, [%1];" : "=l"(v) : "l"(p));
  else v = __ldg(p);
  return v;
}
template <bool Cs> __device__ __forceinline__ void st(unsigned long long* p, unsigned long long v) {
  if (Cs) __stcs(p, v); else *p = v;
}

__device__ std::uint64_t find_op(const Batch& b, std::uint64_t g) {
  std::uint64_t lo = 0, hi = b.n - 1;
  while (lo < hi) { std::uint64_t mid = lo + (hi - lo + 1) / 2; if (b.ops[mid].first_chunk <= g) lo = mid; else hi = mid - 1; }
  return lo;
}

// Depth: ring; Hint: L2 prefetch size on loads; Pf: prefetch distance in stripes (0 none); Cs: streaming stores
template <int Threads, int Depth, int Hint, int Pf, bool Cs, int Mode = 0>
__global__ void __launch_bounds__(Threads) copy_chunk(const Batch b) {
  const std::uint64_t g = (std::uint64_t)blockIdx.x * (Threads / 4) + threadIdx.x / 4;
  const unsigned lane = threadIdx.x % 4;
  const bool active = g < b.chunks;
  Op op{nullptr, nullptr, 0, 0};
  if (active) op = b.ops[find_op(b, g)];
  const std::uint64_t index = active ? g - op.first_chunk : 0;
  const std::uint64_t begin = index * C;
  const std::uint64_t rest = op.bytes - begin;
  const std::uint64_t len = active ? (rest < C ? rest : C) : 0;
  const unsigned char* src = active ? op.src + begin : nullptr;
  unsigned char* dst = active ? op.dst + begin : nullptr;
  const std::uint64_t stripes = len / 32;
  std::uint64_t acc = xxh64::initial_accumulator((int)lane, index);
  const unsigned long long* w = reinterpret_cast<const unsigned long long*>(src) + lane;
  unsigned long long* o = reinterpret_cast<unsigned long long*>(dst) + lane;
  std::uint64_t s = 0;
  if (stripes >= Depth) {
    unsigned long long ring[Depth];
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) ring[u] = ld<Hint>(w + 4 * u);
    for (; s + 2 * Depth <= stripes; s += Depth) {
#pragma unroll
      for (unsigned u = 0; u < Depth; ++u) {
        if (Pf > 0 && (u % 4) == lane) {
          const std::uint64_t t = s + u + Pf;
          if (t < stripes) asm volatile("prefetch.global.L2 [%0];" :: "l"(w - lane + 4 * t));
        }
        const std::uint64_t word = ring[u];
        if (Mode != 1) acc = xxh64::accumulate(acc, word); else acc ^= word;
        if (Mode != 2) st<Cs>(o + 4 * (s + u), word);
        ring[u] = ld<Hint>(w + 4 * (s + Depth + u));
      }
    }
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) {
      const std::uint64_t word = ring[u];
      acc = xxh64::accumulate(acc, word);
      st<Cs>(o + 4 * (s + u), word);
    }
    s += Depth;
  }
  for (; s < stripes; ++s) { const std::uint64_t word = ld<Hint>(w + 4 * s); acc = xxh64::accumulate(acc, word); st<Cs>(o + 4 * s, word); }
  const unsigned first = (threadIdx.x % 32) & ~3u;
  std::uint64_t v[4];
#pragma unroll
  for (unsigned i = 0; i < 4; ++i) v[i] = __shfl_sync(0xffffffffu, (unsigned long long)acc, first + i);
  if (!active || lane != 0) return;
  const std::uint64_t striped = stripes * 32;
  for (std::uint64_t i = striped; i < len; ++i) dst[i] = src[i];
  const std::uint64_t h = len >= 32 ? xxh64::converge(v) : index + xxh64::kPrime5;
  b.hashes[g] = xxh64::finish(h, len, src + striped, len - striped);
}

// 2 threads per chunk, each 2 accumulators, 16-byte loads/stores
template <int Threads, int Depth>
__global__ void __launch_bounds__(Threads) copy_chunk2(const Batch b) {
  const std::uint64_t g = (std::uint64_t)blockIdx.x * (Threads / 2) + threadIdx.x / 2;
  const unsigned lane = threadIdx.x % 2;
  const bool active = g < b.chunks;
  Op op{nullptr, nullptr, 0, 0};
  if (active) op = b.ops[find_op(b, g)];
  const std::uint64_t index = active ? g - op.first_chunk : 0;
  const std::uint64_t begin = index * C;
  const std::uint64_t rest = op.bytes - begin;
  const std::uint64_t len = active ? (rest < C ? rest : C) : 0;
  const unsigned char* src = active ? op.src + begin : nullptr;
  unsigned char* dst = active ? op.dst + begin : nullptr;
  const std::uint64_t stripes = len / 32;
  std::uint64_t a0 = xxh64::initial_accumulator((int)(2 * lane), index);
  std::uint64_t a1 = xxh64::initial_accumulator((int)(2 * lane + 1), index);
  const ulonglong2* w = reinterpret_cast<const ulonglong2*>(src) + lane;
  ulonglong2* o = reinterpret_cast<ulonglong2*>(dst) + lane;
  std::uint64_t s = 0;
  if (stripes >= Depth) {
    ulonglong2 ring[Depth];
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) ring[u] = __ldg(w + 2 * u);
    for (; s + 2 * Depth <= stripes; s += Depth) {
#pragma unroll
      for (unsigned u = 0; u < Depth; ++u) {
        const ulonglong2 v = ring[u];
        a0 = xxh64::accumulate(a0, v.x); a1 = xxh64::accumulate(a1, v.y);
        o[2 * (s + u)] = v;
        ring[u] = __ldg(w + 2 * (s + Depth + u));
      }
    }
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) { const ulonglong2 v = ring[u]; a0 = xxh64::accumulate(a0, v.x); a1 = xxh64::accumulate(a1, v.y); o[2 * (s + u)] = v; }
    s += Depth;
  }
  for (; s < stripes; ++s) { const ulonglong2 v = __ldg(w + 2 * s); a0 = xxh64::accumulate(a0, v.x); a1 = xxh64::accumulate(a1, v.y); o[2 * s] = v; }
  const unsigned first = (threadIdx.x % 32) & ~1u;
  std::uint64_t v[4];
  v[0] = __shfl_sync(0xffffffffu, (unsigned long long)a0, first); v[1] = __shfl_sync(0xffffffffu, (unsigned long long)a1, first);
  v[2] = __shfl_sync(0xffffffffu, (unsigned long long)a0, first + 1); v[3] = __shfl_sync(0xffffffffu, (unsigned long long)a1, first + 1);
  if (!active || lane != 0) return;
  const std::uint64_t striped = stripes * 32;
  for (std::uint64_t i = striped; i < len; ++i) dst[i] = src[i];
  const std::uint64_t h = len >= 32 ? xxh64::converge(v) : index + xxh64::kPrime5;
  b.hashes[g] = xxh64::finish(h, len, src + striped, len - striped);
}
#include "ferry/sdk/fingerprint_cuda.cuh"
namespace fpc = ferry::sdk::fingerprint_cuda;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(std::uint64_t* bar) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar))); }
__device__ __forceinline__ void mbar_expect(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" :: "r"(smem_addr(bar)), "r"(parity) : "memory"); }
__device__ __forceinline__ void bulk_load(void* sdst, const void* gsrc, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(sdst)), "l"(gsrc), "r"(bytes), "r"(smem_addr(bar)) : "memory"); }
__device__ __forceinline__ void bulk_store(void* gdst, const void* ssrc, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(gdst), "r"(smem_addr(ssrc)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Persistent: each group of 4 threads loops over chunks g, g + G, ...; a chunk's striped bytes go
// through the group's ring of NB shared-memory tiles of T bytes (bulk load in, bulk store out, hashed
// from shared memory); misaligned ops take the register path.
template <int GPB, int NB, int T>
__global__ void __launch_bounds__(GPB * 4) copy_tma(const Batch b) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ std::uint64_t bars[GPB][NB];
  const unsigned gib = threadIdx.x / 4;          // group in block
  const unsigned lane = threadIdx.x % 4;
  const unsigned gmask = 0xfu << ((threadIdx.x % 32) & ~3u);
  unsigned char* ring = smem + (std::size_t)gib * NB * T;
  if (lane == 0) { for (int i = 0; i < NB; ++i) mbar_init(&bars[gib][i]); asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
  __syncwarp(gmask);
  const std::uint64_t G = (std::uint64_t)gridDim.x * GPB;
  const std::uint64_t g0 = (std::uint64_t)blockIdx.x * GPB + gib;
  const std::uint64_t warp_first = (std::uint64_t)blockIdx.x * GPB + (threadIdx.x / 32) * 8;
  std::uint64_t u = 0;  // tiles through this group's ring so far
  for (std::uint64_t k = 0; warp_first + k * G < b.chunks; ++k) {
    const std::uint64_t g = g0 + k * G;
    const bool active = g < b.chunks;
    Op op{nullptr, nullptr, 0, 0};
    if (active) op = b.ops[find_op(b, g)];
    const std::uint64_t index = active ? g - op.first_chunk : 0;
    const std::uint64_t begin = index * C;
    const std::uint64_t rest = op.bytes - begin;
    const std::uint64_t len = active ? (rest < C ? rest : C) : 0;
    const unsigned char* src = active ? op.src + begin : nullptr;
    unsigned char* dst = active ? op.dst + begin : nullptr;
    const std::uint64_t stripes = len / 32;
    std::uint64_t acc = xxh64::initial_accumulator((int)lane, index);
    const bool bulk = ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) == 0;
    if (active && bulk && stripes > 0) {
      const std::uint64_t striped = stripes * 32;
      const unsigned nt = (unsigned)((striped + T - 1) / T);
      auto tile_bytes = [&](unsigned t) { const std::uint64_t r = striped - (std::uint64_t)t * T; return (unsigned)(r < T ? r : T); };
      if (lane == 0) {
        for (unsigned t = 0; t < nt && t < NB; ++t) {
          const unsigned bi = (unsigned)((u + t) % NB);
          mbar_expect(&bars[gib][bi], tile_bytes(t));
          bulk_load(ring + (std::size_t)bi * T, src + (std::size_t)t * T, tile_bytes(t), &bars[gib][bi]);
        }
      }
      for (unsigned t = 0; t < nt; ++t, ++u) {
        const unsigned bi = (unsigned)(u % NB);
        unsigned char* buf = ring + (std::size_t)bi * T;
        mbar_wait(&bars[gib][bi], (unsigned)((u / NB) & 1));
        const unsigned bytes = tile_bytes(t);
        if (lane == 0) bulk_store(dst + (std::size_t)t * T, buf, bytes);
        const unsigned long long* w = reinterpret_cast<const unsigned long long*>(buf) + lane;
        const unsigned n = bytes / 32;
#pragma unroll 8
        for (unsigned i = 0; i < n; ++i) acc = xxh64::accumulate(acc, w[4 * i]);
        __syncwarp(gmask);
        if (lane == 0 && t + NB < nt) {
          bulk_wait_read0();
          fence_async();
          mbar_expect(&bars[gib][bi], tile_bytes(t + NB));
          bulk_load(buf, src + (std::size_t)(t + NB) * T, tile_bytes(t + NB), &bars[gib][bi]);
        }
      }
      if (lane == 0) bulk_wait_read0();
      __syncwarp(gmask);
    } else if (active) {
      if ((reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0)
        acc = fpc::run_lane(src, stripes, acc, lane, fpc::AlignedStores{reinterpret_cast<unsigned long long*>(dst) + lane});
      else
        acc = fpc::run_lane(src, stripes, acc, lane, fpc::ByteStores{dst + 8 * lane});
    }
    const unsigned first = (threadIdx.x % 32) & ~3u;
    std::uint64_t v[4];
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) v[i] = __shfl_sync(0xffffffffu, (unsigned long long)acc, first + i);
    if (active && lane == 0) {
      const std::uint64_t striped = stripes * 32;
      for (std::uint64_t i = striped; i < len; ++i) dst[i] = src[i];
      const std::uint64_t h = len >= 32 ? xxh64::converge(v) : index + xxh64::kPrime5;
      b.hashes[g] = xxh64::finish(h, len, src + striped, len - striped);
    }
  }
  if (lane == 0) bulk_wait0();
}
// A different fingerprint format, to measure what the access pattern costs: a chunk's 16-byte
// units are dealt round-robin to the 32 lanes of one warp (lane l: units l, l + 32, ..), each lane
// runs two XXH64 accumulators (the units' low and high words), seeded with the chunk's index and
// the lane; the chunk's hash is XXH64 of the 64 accumulators (and the < 16 tail bytes after them),
// seeded with the chunk's length. A warp's loads and stores are then 512 contiguous bytes, as in
// a plain copy. Not ferry's format (xxh64-chunked-v1): fingerprints here are checked against
// wide_chunk_cpu().
template <int Warps, int Depth>
__global__ void __launch_bounds__(Warps * 32) copy_wide(const Batch b) {
  __shared__ std::uint64_t accs[Warps][64 + 2];
  const unsigned w = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t g = (std::uint64_t)blockIdx.x * Warps + w;
  if (g >= b.chunks) return;  // whole warps only
  const Op op = b.ops[find_op(b, g)];
  const std::uint64_t index = g - op.first_chunk;
  const std::uint64_t begin = index * C;
  const std::uint64_t rest = op.bytes - begin;
  const std::uint64_t len = rest < C ? rest : C;
  const unsigned char* src = op.src + begin;
  unsigned char* dst = op.dst + begin;
  const std::uint64_t units = len / 16;
  const uint4* s4 = reinterpret_cast<const uint4*>(src);
  uint4* d4 = reinterpret_cast<uint4*>(dst);
  std::uint64_t a0 = xxh64::initial_accumulator(0, index * 64 + 2 * lane);
  std::uint64_t a1 = xxh64::initial_accumulator(1, index * 64 + 2 * lane + 1);
  const std::uint64_t mine = units > lane ? (units - lane + 31) / 32 : 0;  // units of this lane
  std::uint64_t k = 0;
  if (mine >= Depth) {
    uint4 ring[Depth];
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) ring[u] = __ldg(s4 + lane + 32 * u);
    for (; k + 2 * Depth <= mine; k += Depth) {
#pragma unroll
      for (unsigned u = 0; u < Depth; ++u) {
        const uint4 v = ring[u];
        a0 = xxh64::accumulate(a0, (std::uint64_t)v.x | ((std::uint64_t)v.y << 32));
        a1 = xxh64::accumulate(a1, (std::uint64_t)v.z | ((std::uint64_t)v.w << 32));
        d4[lane + 32 * (k + u)] = v;
        ring[u] = __ldg(s4 + lane + 32 * (k + Depth + u));
      }
    }
#pragma unroll
    for (unsigned u = 0; u < Depth; ++u) {
      const uint4 v = ring[u];
      a0 = xxh64::accumulate(a0, (std::uint64_t)v.x | ((std::uint64_t)v.y << 32));
      a1 = xxh64::accumulate(a1, (std::uint64_t)v.z | ((std::uint64_t)v.w << 32));
      d4[lane + 32 * (k + u)] = v;
    }
    k += Depth;
  }
  for (; k < mine; ++k) {
    const uint4 v = __ldg(s4 + lane + 32 * k);
    a0 = xxh64::accumulate(a0, (std::uint64_t)v.x | ((std::uint64_t)v.y << 32));
    a1 = xxh64::accumulate(a1, (std::uint64_t)v.z | ((std::uint64_t)v.w << 32));
    d4[lane + 32 * k] = v;
  }
  accs[w][2 * lane] = a0;
  accs[w][2 * lane + 1] = a1;
  __syncwarp();
  if (lane == 0) {
    const std::uint64_t tail = len - units * 16;
    unsigned char* t = reinterpret_cast<unsigned char*>(&accs[w][64]);
    for (std::uint64_t i = 0; i < tail; ++i) { t[i] = src[units * 16 + i]; dst[units * 16 + i] = src[units * 16 + i]; }
    b.hashes[g] = xxh64::hash(accs[w], 64 * 8 + tail, len);
  }
}
static std::uint64_t wide_chunk_cpu(const unsigned char* p, std::uint64_t len, std::uint64_t index) {
  std::uint64_t acc[64 + 2] = {};
  const std::uint64_t units = len / 16;
  for (unsigned lane = 0; lane < 32; ++lane) {
    std::uint64_t a0 = xxh64::initial_accumulator(0, index * 64 + 2 * lane);
    std::uint64_t a1 = xxh64::initial_accumulator(1, index * 64 + 2 * lane + 1);
    for (std::uint64_t u = lane; u < units; u += 32) {
      a0 = xxh64::accumulate(a0, xxh64::read64(p + 16 * u));
      a1 = xxh64::accumulate(a1, xxh64::read64(p + 16 * u + 8));
    }
    acc[2 * lane] = a0;
    acc[2 * lane + 1] = a1;
  }
  const std::uint64_t tail = len - units * 16;
  std::memcpy(&acc[64], p + units * 16, tail);
  return xxh64::hash(acc, 64 * 8 + tail, len);
}
__global__ void combine(const Batch b) {
  const std::uint64_t i = (std::uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= b.n) return;
  const Op op = b.ops[i];
  const std::uint64_t chunks = (op.bytes + C - 1) / C;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(b.hashes + op.first_chunk);
  b.results[i] = xxh64::hash(p, chunks * 8, op.bytes);
}

#include "batch_copy.hpp"
__global__ void fill(unsigned long long* p, std::uint64_t n, unsigned long long seed) {
  for (std::uint64_t i = (std::uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (std::uint64_t)gridDim.x * blockDim.x) {
    unsigned long long x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed; x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29; p[i] = x; }
}
__global__ void diff(const unsigned long long* a, const unsigned long long* b, std::uint64_t n, unsigned long long* bad) {
  for (std::uint64_t i = (std::uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (std::uint64_t)gridDim.x * blockDim.x) if (a[i] != b[i]) atomicAdd(bad, 1ull);
}
struct Case { std::string name; std::vector<std::uint64_t> sizes; };
static std::vector<std::uint64_t> qwen(int layers) {
  std::vector<std::uint64_t> v; v.push_back(151936ull*4096*2);
  for (int l = 0; l < layers; ++l) { for (auto x : {33554432ull, 8388608ull, 8388608ull, 33554432ull, 256ull, 256ull, 100663296ull, 100663296ull, 100663296ull, 8192ull, 8192ull}) v.push_back(x); }
  v.push_back(8192); v.push_back(151936ull*4096*2); return v;
}
using Launch = void (*)(const Batch&, cudaStream_t);
template <int GPB, int NB, int T> void runt(const Batch& b, cudaStream_t st) {
  static int blocks = 0;
  const int smem = GPB * NB * T;
  if (blocks == 0) {
    CK(cudaFuncSetAttribute(copy_tma<GPB, NB, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_tma<GPB, NB, T>, GPB * 4, smem));
    int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    blocks = per_sm * sms; printf("    [GPB %d NB %d T %d: %d blocks/SM, %d groups]\n", GPB, NB, T, per_sm, blocks * GPB);
  }
  copy_tma<GPB, NB, T><<<blocks, GPB * 4, smem, st>>>(b);
  CK(cudaGetLastError());
  combine<<<(unsigned)((b.n + 127) / 128), 128, 0, st>>>(b);
}
template <int W, int D> void runw(const Batch& b, cudaStream_t st) {
  copy_wide<W, D><<<(unsigned)((b.chunks + W - 1) / W), W * 32, 0, st>>>(b);
  combine<<<(unsigned)((b.n + 127) / 128), 128, 0, st>>>(b);
}
template <int T, int D> void run2(const Batch& b, cudaStream_t st) {
  copy_chunk2<T, D><<<(unsigned)((b.chunks + T / 2 - 1) / (T / 2)), T, 0, st>>>(b);
  combine<<<(unsigned)((b.n + 127) / 128), 128, 0, st>>>(b);
}
template <int T, int D, int H, int P, bool Cs, int M = 0> void run(const Batch& b, cudaStream_t st) {
  copy_chunk<T, D, H, P, Cs, M><<<(unsigned)((b.chunks + T / 4 - 1) / (T / 4)), T, 0, st>>>(b);
  combine<<<(unsigned)((b.n + 127) / 128), 128, 0, st>>>(b);
}
int main(int argc, char** argv) {
  FILE* json = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  std::vector<Case> cases{{"qwen3-8b 5 layers", qwen(5)}, {"qwen3-8b 36 layers", qwen(36)}, {"256 x 64 MiB", std::vector<std::uint64_t>(256, 64ull << 20)}};
  struct V { const char* name; Launch f; };
  std::vector<V> vs{{"production pattern (depth 32, L2 128B)", run<64, 32, 128, 0, false>},
                    {"ring depth 64", run<64, 64, 128, 0, false>},
                    {"L2 prefetch 256B", run<64, 32, 256, 0, false>},
                    {"explicit prefetch 128 stripes ahead", run<64, 32, 128, 128, false>},
                    {"streaming stores", run<64, 32, 128, 0, true>},
                    {"same pattern, copy only", run<64, 32, 128, 0, false, 1>},
                    {"same pattern, hash only", run<64, 32, 128, 0, false, 2>},
                    {"2 threads per chunk, 16 B words", run2<64, 16>},
                    {"TMA tiles 32 groups x 2 x 2 KiB", runt<32, 2, 2048>},
                    {"TMA tiles 16 groups x 4 x 1 KiB", runt<16, 4, 1024>},
                    {"TMA tiles 64 groups x 3 x 1 KiB", runt<64, 3, 1024>},
                    {"other format: warp-interleaved, depth 4", runw<8, 4>},
                    {"other format: warp-interleaved, depth 8", runw<8, 8>},
                    {"other format: warp-interleaved, depth 8, 4 warps", runw<4, 8>}};
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (auto& c : cases) {
    std::vector<std::uint64_t> off; std::uint64_t total = 0, chunks = 0;
    std::vector<Op> ops;
    for (auto s : c.sizes) { off.push_back(total); total += (s + 511) / 512 * 512; }
    unsigned char *src, *dst, *ref; CK(cudaMalloc(&src, total)); CK(cudaMalloc(&dst, total)); CK(cudaMalloc(&ref, total));
    fill<<<4096, 256>>>((unsigned long long*)src, total / 8, 42); CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < c.sizes.size(); ++i) { ops.push_back({src + off[i], dst + off[i], c.sizes[i], chunks}); chunks += (c.sizes[i] + C - 1) / C; }
    Op* dops; std::uint64_t *hashes, *results, *bad; CK(cudaMalloc(&dops, ops.size() * sizeof(Op))); CK(cudaMalloc(&hashes, chunks * 8)); CK(cudaMalloc(&results, ops.size() * 8)); CK(cudaMalloc(&bad, 8));
    CK(cudaMemcpy(dops, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
    Batch b{dops, ops.size(), chunks, hashes, results};
    auto time = [&](auto&& f) { std::vector<float> t; for (int r = 0; r < 12; ++r) { CK(cudaEventRecord(e0, st)); f(); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (r >= 2) t.push_back(ms); } std::sort(t.begin(), t.end()); return t[t.size() / 2]; };
    float d2d = time([&] { CK(cudaMemcpyAsync(ref, src, total, cudaMemcpyDeviceToDevice, st)); });
    // production
    std::vector<ferry::cuda_ipc::CopyOp> pops; for (auto& o : ops) pops.push_back({o.src, o.dst, o.bytes});
    void* pin; CK(cudaMallocHost(&pin, ferry::cuda_ipc::fingerprinted_copy_staging_bytes(pops.size()))); std::uint64_t* presults; CK(cudaMalloc(&presults, ops.size() * 8));
    float prod = time([&] { CK(ferry::cuda_ipc::launch_fingerprinted_copy(pops.data(), pops.size(), presults, pin, st)); });
    float plain = 0; { std::vector<float> ts; for (int r = 0; r < 12; ++r) { CK(cudaEventRecord(e0, st)); for (size_t k = 0; k < pops.size(); k += 512) CK(ferry::cuda_ipc::launch_batch_copy(pops.data() + k, std::min<size_t>(512, pops.size() - k), st)); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (r >= 2) ts.push_back(ms); } std::sort(ts.begin(), ts.end()); plain = ts[ts.size()/2]; }
    std::vector<std::uint64_t> want(ops.size()), got(ops.size()); CK(cudaMemcpy(want.data(), presults, ops.size() * 8, cudaMemcpyDeviceToHost));
    printf("\n%s: %zu ops, %.3f GB, %llu chunks; D2D %.3f ms (%.0f GB/s); production fingerprinting copy %.3f ms = %.3f of D2D; plain batch copy (no fingerprints) %.3f ms = %.3f\n", c.name.c_str(), ops.size(), total / 1e9, (unsigned long long)chunks, d2d, total / d2d / 1e6, prod, d2d / prod, plain, d2d / plain);
    for (auto& v : vs) {
      CK(cudaMemcpy(dst, src, total, cudaMemcpyDeviceToDevice)); for (auto& o : ops) CK(cudaMemset(o.dst, 0, o.bytes)); CK(cudaMemset(results, 0, ops.size() * 8)); CK(cudaDeviceSynchronize());
      v.f(b, st); CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
      CK(cudaMemcpy(got.data(), results, ops.size() * 8, cudaMemcpyDeviceToHost));
      CK(cudaMemset(bad, 0, 8)); diff<<<4096, 256>>>((unsigned long long*)src, (unsigned long long*)dst, total / 8, (unsigned long long*)bad); std::uint64_t nbad; CK(cudaMemcpy(&nbad, bad, 8, cudaMemcpyDeviceToHost));
      float ms = time([&] { v.f(b, st); });
      std::string fp_check = got == want ? "equal" : "DIFFER";
      if (std::string(v.name).rfind("other format", 0) == 0) {
        // against the CPU reference, over the chunks of up to 48 ops spread over the case
        std::vector<std::uint64_t> dev_hashes(chunks);
        CK(cudaMemcpy(dev_hashes.data(), hashes, chunks * 8, cudaMemcpyDeviceToHost));
        bool same = true;
        std::vector<unsigned char> host;
        for (size_t i = 0; i < ops.size() && same; i += 1 + ops.size() / 48) {
          host.resize(ops[i].bytes);
          CK(cudaMemcpy(host.data(), ops[i].src, ops[i].bytes, cudaMemcpyDeviceToHost));
          for (std::uint64_t c = 0; c * C < ops[i].bytes || (c == 0 && ops[i].bytes == 0); ++c) {
            const std::uint64_t l = std::min<std::uint64_t>(C, ops[i].bytes - c * C);
            if (wide_chunk_cpu(host.data() + c * C, l, c) != dev_hashes[ops[i].first_chunk + c]) { same = false; break; }
          }
        }
        fp_check = same ? "equal to its CPU twin" : "DIFFER from its CPU twin";
      }
      printf("  %-40s %.3f ms  %.3f of D2D  %.0f GB/s  fingerprints %s  bytes %s\n", v.name, ms, d2d / ms, total / ms / 1e6, fp_check.c_str(), nbad == 0 ? "equal" : "DIFFER");
      if (json) std::fprintf(json, "{\"case\": \"%s\", \"variant\": \"%s\", \"ms\": %.4f, \"d2d_ms\": %.4f, \"of_d2d\": %.4f, \"production_ms\": %.4f, \"fingerprints\": \"%s\", \"bytes_equal\": %s}\n", c.name.c_str(), v.name, ms, d2d, d2d / ms, prod, fp_check.c_str(), nbad == 0 ? "true" : "false");
    }
    cudaFree(src); cudaFree(dst); cudaFree(ref); cudaFree(dops); cudaFree(hashes); cudaFree(results); cudaFree(presults); cudaFreeHost(pin); cudaFree(bad);
  }
  if (json) std::fclose(json);
}
