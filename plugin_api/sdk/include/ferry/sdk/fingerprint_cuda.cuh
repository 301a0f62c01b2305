// ferry/sdk/fingerprint_cuda.cuh: the device building blocks of xxh64-interleaved-v1
// (docs/fingerprint.md, definitions in ferry/sdk/fingerprint.hpp), shared by ferry's CUDA
// fingerprint kernel (kernels/cuda/fingerprint.cu) and by transport plugins that fingerprint the
// bytes they copy in the same pass (plugins/cuda_ipc/batch_copy.cu). Header-only device code:
// include it from .cu files only.
//
// Contract of warp_chunk_hash() (a chunk's hash):
//  - Called by all 32 lanes of one warp with the same chunk. Lane j reads the 16-byte units j,
//    j + 32, j + 64, .. of the chunk and runs accumulators 2j and 2j + 1 over their two words,
//    so the warp's loads (and stores) are 512 contiguous bytes, as in a plain copy. A ring of
//    loads is kept in flight in registers.
//  - `scratch` is 66 words of shared memory the warp owns (kWarpScratchWords). The hash is
//    returned to lane 0 (the others get 0).
//  - Given CopyTo{dst}, the warp also stores every byte it hashes to the same offset at `dst`.
//    The source may have any alignment (a misaligned one reads the two aligned 16-byte blocks
//    around each unit; both hold bytes of the unit, so they lie in its pages and cannot fault);
//    so may the destination (16-byte aligned: 16-byte stores; 8-byte: 8-byte; else bytes).
//  - The source is read through the read-only (non-coherent) path: it must not be written while
//    the kernel runs (a copy's source must not overlap any destination of the launch).
//
// Contract of group_hash() (plain XXH64 of a byte range, for the combine step: a range's chunk
// hashes seeded with its length):
//  - A *group* is four consecutive threads 4k .. 4k + 3 of one warp; the thread with `lane` k
//    (0..3) runs XXH64's accumulator k over the k-th 8-byte word of every 32-byte stripe. The
//    accumulators meet by warp shuffles over the whole warp, so every thread of the warp must
//    call group_hash at the same point; a thread whose group has nothing to hash passes
//    active = false and reads nothing.
//  - The hash is returned to the group's lane 0 (the others get 0). Any alignment.
#pragma once

#if !defined(__CUDACC__)
#error "ferry/sdk/fingerprint_cuda.cuh holds device code: include it from .cu files (nvcc) only"
#endif

#include "ferry/sdk/fingerprint.hpp"
#include "ferry/sdk/xxh64.hpp"

#include <cstdint>

namespace ferry::sdk::fingerprint_cuda {

// C of docs/fingerprint.md (ferry::kernels::kFingerprintChunkBytes).
inline constexpr std::uint64_t kChunkBytes = fingerprint::kChunkBytes;
// Threads per group_hash: XXH64's four accumulators.
inline constexpr unsigned kGroup = 4;
// Shared memory words a warp_chunk_hash needs: the 64 accumulators and a tail of < 16 bytes.
inline constexpr unsigned kWarpScratchWords = fingerprint::kAccumulators + 2;

// ---- group_hash: plain XXH64 of a byte range by four threads --------------------------------

// A read-only 8-byte load that asks L2 to fetch the whole 128-byte line from memory (the next
// stripes then hit L2).
__device__ __forceinline__ unsigned long long load_stream(const unsigned long long* p) {
  unsigned long long v;
  asm("ld.global.nc.L2::128B.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

// Reads one accumulator's words from an 8-byte aligned input: stripe s's word is words[4 s].
struct AlignedWords {
  static constexpr unsigned kDepth = 32;  // loads in flight per thread
  using Raw = unsigned long long;
  const unsigned long long* words;  // the thread's first word
  __device__ __forceinline__ Raw load(std::uint64_t s) const { return load_stream(words + 4 * s); }
  __device__ __forceinline__ std::uint64_t word(Raw raw) const { return raw; }
};

// Reads one accumulator's words from an input `shift / 8` bytes past an 8-byte boundary: each
// word is put together from the two aligned words that hold it. Both hold a byte of the word, so
// they lie in its pages (the loads cannot fault); the bytes outside the range are shifted out.
struct MisalignedWords {
  static constexpr unsigned kDepth = 16;  // two loads per word: the same bytes in flight
  struct Raw {
    unsigned long long lo;
    unsigned long long hi;
  };
  const unsigned long long* words;  // the aligned word holding the thread's first byte
  unsigned shift;                   // 8, 16, .. 56 bits
  __device__ __forceinline__ Raw load(std::uint64_t s) const {
    return {load_stream(words + 4 * s), load_stream(words + 4 * s + 1)};
  }
  __device__ __forceinline__ std::uint64_t word(Raw raw) const {
    return (raw.lo >> shift) | (raw.hi << (64 - shift));
  }
};

// Calls step(k, raw) for k = 0 .. count - 1 in order, raw being in.load(k): every load is issued
// Loads::kDepth steps before its use, so the loads overlap the dependent chain of accumulate
// steps (the ring lives in registers).
template <class Loads, class Step>
__device__ __forceinline__ void pipelined(const Loads& in, std::uint64_t count, Step step) {
  constexpr unsigned kDepth = Loads::kDepth;
  std::uint64_t k = 0;  // steps taken so far
  if (count >= kDepth) {
    typename Loads::Raw ring[kDepth];  // ring[u] holds load k + u
#pragma unroll
    for (unsigned u = 0; u < kDepth; ++u) ring[u] = in.load(u);
    for (; k + 2 * kDepth <= count; k += kDepth) {
#pragma unroll
      for (unsigned u = 0; u < kDepth; ++u) {
        step(k + u, ring[u]);
        ring[u] = in.load(k + kDepth + u);
      }
    }
#pragma unroll
    for (unsigned u = 0; u < kDepth; ++u) step(k + u, ring[u]);
    k += kDepth;
  }
  for (; k < count; ++k) step(k, in.load(k));
}

// Runs one XXH64 accumulator over `stripes` stripes.
template <class Words>
__device__ __forceinline__ std::uint64_t run_accumulator(const Words& in, std::uint64_t stripes,
                                                         std::uint64_t acc) {
  pipelined(in, stripes, [&](std::uint64_t, const typename Words::Raw& raw) {
    acc = xxh64::accumulate(acc, in.word(raw));
  });
  return acc;
}

// Runs accumulator `lane` over `stripes` stripes of `p` (any alignment).
__device__ __forceinline__ std::uint64_t run_lane(const unsigned char* p, std::uint64_t stripes,
                                                  std::uint64_t acc, unsigned lane) {
  const auto misalignment = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(p) & 7u);
  if (misalignment == 0) {
    return run_accumulator(AlignedWords{reinterpret_cast<const unsigned long long*>(p) + lane},
                           stripes, acc);
  }
  return run_accumulator(
      MisalignedWords{reinterpret_cast<const unsigned long long*>(p - misalignment) + lane,
                      8 * misalignment},
      stripes, acc);
}

// XXH64 of `len` bytes at `p` with `seed` by the group of the calling thread (`lane` = 0..3
// within the group); see the contract at the top of this file. Used for short inputs (a range's
// chunk hashes: 8 bytes per MiB).
__device__ inline std::uint64_t group_hash(const unsigned char* p, std::uint64_t len,
                                           std::uint64_t seed, unsigned lane, bool active) {
  const std::uint64_t stripes = active ? len / xxh64::kStripeBytes : 0;
  std::uint64_t acc = xxh64::initial_accumulator(static_cast<int>(lane), seed);
  acc = run_lane(p, stripes, acc, lane);
  // Every group of the warp rejoins here before the shuffles.
  const unsigned first = (threadIdx.x % 32) & ~(kGroup - 1);
  std::uint64_t v[kGroup];
#pragma unroll
  for (unsigned i = 0; i < kGroup; ++i) {
    v[i] = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(acc), first + i);
  }
  if (!active || lane != 0) return 0;
  const std::uint64_t striped = stripes * xxh64::kStripeBytes;
  const std::uint64_t h = len >= xxh64::kStripeBytes ? xxh64::converge(v) : seed + xxh64::kPrime5;
  return xxh64::finish(h, len, p + striped, len - striped);
}

// ---- warp_chunk_hash: one chunk of xxh64-interleaved-v1 by a warp ---------------------------

// A unit's two little-endian words.
struct UnitWords {
  std::uint64_t lo;
  std::uint64_t hi;
};

__device__ __forceinline__ UnitWords words_of(const uint4& v) {
  return {static_cast<std::uint64_t>(v.x) | (static_cast<std::uint64_t>(v.y) << 32),
          static_cast<std::uint64_t>(v.z) | (static_cast<std::uint64_t>(v.w) << 32)};
}

// Reads the lane's units from a 16-byte aligned chunk: its k-th unit is units[32 k].
struct AlignedUnits {
  static constexpr unsigned kDepth = 8;  // units in flight per lane: 4 KiB per warp
  using Raw = uint4;
  const uint4* units;  // the lane's first unit
  __device__ __forceinline__ Raw load(std::uint64_t k) const { return __ldg(units + 32 * k); }
  __device__ __forceinline__ UnitWords words(const Raw& raw) const { return words_of(raw); }
};

// Bytes [shift, shift + 8) of the little-endian pair (a, b), shift in 0..7 bytes.
__device__ __forceinline__ std::uint64_t funnel(std::uint64_t a, std::uint64_t b, unsigned bits) {
  return bits == 0 ? a : (a >> bits) | (b << (64 - bits));
}

// Reads the lane's units from a chunk `shift` (1..15) bytes past a 16-byte boundary: each unit is
// put together from the two aligned 16-byte blocks that hold it.
struct MisalignedUnits {
  static constexpr unsigned kDepth = 4;  // two loads per unit: the same bytes in flight
  struct Raw {
    uint4 a;
    uint4 b;
  };
  const uint4* units;  // the aligned block holding the lane's first byte
  unsigned shift;      // bytes past the block's start, 1..15
  __device__ __forceinline__ Raw load(std::uint64_t k) const {
    return {__ldg(units + 32 * k), __ldg(units + 32 * k + 1)};
  }
  __device__ __forceinline__ UnitWords words(const Raw& raw) const {
    const UnitWords a = words_of(raw.a);
    const UnitWords b = words_of(raw.b);
    const unsigned bits = 8 * (shift % 8);
    if (shift < 8) return {funnel(a.lo, a.hi, bits), funnel(a.hi, b.lo, bits)};
    return {funnel(a.hi, b.lo, bits), funnel(b.lo, b.hi, bits)};
  }
};

// Where the lane's units go once hashed: unit k to the same offset of the destination, or nowhere.
struct NoUnitStores {
  __device__ __forceinline__ void store(std::uint64_t, const UnitWords&) const {}
};
struct AlignedUnitStores {  // a 16-byte aligned destination
  uint4* units;              // the lane's first unit
  __device__ __forceinline__ void store(std::uint64_t k, const UnitWords& w) const {
    units[32 * k] = make_uint4(static_cast<unsigned>(w.lo), static_cast<unsigned>(w.lo >> 32),
                               static_cast<unsigned>(w.hi), static_cast<unsigned>(w.hi >> 32));
  }
};
struct WordUnitStores {  // an 8-byte aligned destination
  unsigned long long* words;  // the lane's first unit's first word
  __device__ __forceinline__ void store(std::uint64_t k, const UnitWords& w) const {
    words[64 * k] = w.lo;
    words[64 * k + 1] = w.hi;
  }
};
struct ByteUnitStores {  // a destination of any alignment (slow)
  unsigned char* bytes;  // the lane's first unit's first byte
  __device__ __forceinline__ void store(std::uint64_t k, const UnitWords& w) const {
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      bytes[512 * k + i] = static_cast<unsigned char>(w.lo >> (8 * i));
      bytes[512 * k + 8 + i] = static_cast<unsigned char>(w.hi >> (8 * i));
    }
  }
};

// Runs the lane's two accumulators over its `count` units, handing each unit to `out` after
// hashing it.
template <class Units, class Stores>
__device__ __forceinline__ void run_units(const Units& in, std::uint64_t count, std::uint64_t& a0,
                                          std::uint64_t& a1, const Stores& out) {
  pipelined(in, count, [&](std::uint64_t k, const typename Units::Raw& raw) {
    const UnitWords w = in.words(raw);
    a0 = xxh64::accumulate(a0, w.lo);
    a1 = xxh64::accumulate(a1, w.hi);
    out.store(k, w);
  });
}

// The lane's units read from `src` (any alignment), stored by `out`.
template <class Stores>
__device__ __forceinline__ void run_lane_units(const unsigned char* src, std::uint64_t count,
                                               unsigned lane, std::uint64_t& a0,
                                               std::uint64_t& a1, const Stores& out) {
  const auto shift = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(src) & 15u);
  if (shift == 0) {
    run_units(AlignedUnits{reinterpret_cast<const uint4*>(src) + lane}, count, a0, a1, out);
  } else {
    run_units(MisalignedUnits{reinterpret_cast<const uint4*>(src - shift) + lane, shift}, count,
              a0, a1, out);
  }
}

// warp_chunk_hash's destination: none (the plain hash) or a copy of the hashed bytes to `dst`.
struct NoCopy {
  static constexpr bool kCopies = false;
};
struct CopyTo {
  static constexpr bool kCopies = true;
  unsigned char* dst;  // receives the `len` bytes hashed
};

// The hash of chunk `index` (`len` <= kChunkBytes bytes at `src`) by the calling warp (`lane` =
// 0..31), and with CopyTo{dst} the copy of those bytes to `dst`; see the contract at the top of
// this file.
template <class Destination = NoCopy>
__device__ inline std::uint64_t warp_chunk_hash(const unsigned char* src, std::uint64_t len,
                                                std::uint64_t index, unsigned lane,
                                                std::uint64_t* scratch,
                                                Destination destination = {}) {
  namespace fpd = ferry::sdk::fingerprint;
  const std::uint64_t units = len / fpd::kUnitBytes;
  // Lane j takes units j, j + 32, ..: ceil((units - j) / 32) of them.
  const std::uint64_t count = units > lane ? (units - lane + fpd::kLanes - 1) / fpd::kLanes : 0;
  std::uint64_t a0 = fpd::initial_accumulator(index, 2 * lane);
  std::uint64_t a1 = fpd::initial_accumulator(index, 2 * lane + 1);
  // The branches depend on the chunk only, so the warp takes them together.
  if constexpr (Destination::kCopies) {
    unsigned char* dst = destination.dst;
    const auto dst_mis = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(dst) & 15u);
    if (dst_mis == 0) {
      run_lane_units(src, count, lane, a0, a1,
                     AlignedUnitStores{reinterpret_cast<uint4*>(dst) + lane});
    } else if (dst_mis == 8) {
      run_lane_units(src, count, lane, a0, a1,
                     WordUnitStores{reinterpret_cast<unsigned long long*>(dst) + 2 * lane});
    } else {
      run_lane_units(src, count, lane, a0, a1, ByteUnitStores{dst + fpd::kUnitBytes * lane});
    }
  } else {
    run_lane_units(src, count, lane, a0, a1, NoUnitStores{});
  }
  scratch[2 * lane] = a0;
  scratch[2 * lane + 1] = a1;
  __syncwarp();
  std::uint64_t h = 0;
  if (lane == 0) {
    const std::uint64_t done = units * fpd::kUnitBytes;
    const std::uint64_t tail_len = len - done;
    auto* tail = reinterpret_cast<unsigned char*>(scratch + fpd::kAccumulators);
    for (std::uint64_t i = 0; i < tail_len; ++i) {
      tail[i] = src[done + i];
      if constexpr (Destination::kCopies) destination.dst[done + i] = src[done + i];
    }
    h = fpd::hash_accumulators(scratch, tail, tail_len, len);
  }
  __syncwarp();  // the scratch may be reused by the warp's next chunk
  return h;
}

}  // namespace ferry::sdk::fingerprint_cuda
