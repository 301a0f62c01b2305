// ferry/sdk/fingerprint_cuda.cuh: the device building blocks of xxh64-chunked-v1
// (docs/fingerprint.md), shared by ferry's CUDA fingerprint kernel (kernels/cuda/fingerprint.cu)
// and by transport plugins that fingerprint the bytes they copy in the same pass
// (plugins/cuda_ipc/batch_copy.cu). Header-only device code: include it from .cu files only.
//
// Contract of group_hash():
//  - A *group* is four consecutive threads 4k .. 4k + 3 of one warp; the thread with `lane` k
//    (0..3) runs XXH64's accumulator k over the k-th 8-byte word of every 32-byte stripe, read
//    straight from global memory with a ring of loads in flight. The accumulators meet by warp
//    shuffles over the whole warp, so every thread of the warp must call group_hash at the same
//    point; a thread whose group has nothing to hash passes active = false and reads nothing.
//  - The hash is returned to the group's lane 0 (the others get 0). The caller picks what to hash
//    (a chunk of C bytes seeded with its index, or a range's chunk hashes seeded with its length)
//    and where the result goes.
//  - Given CopyTo{dst}, the group also stores every byte it hashes to the same offset at `dst`:
//    each thread its words as it hashes them, lane 0 the tail (< 32 bytes) it finishes with. The
//    plain hash (NoCopy, the default) stores nothing and compiles to the read-only loop.
//  - The source is read through the read-only (non-coherent) path with 8-byte loads: it must not
//    be written while the kernel runs (a copy's source must not overlap any destination of the
//    launch), and it may have any alignment (a misaligned source reads the two aligned words
//    around each word; they lie in the word's pages, so they cannot fault). The destination may
//    have any alignment too: 8-byte aligned gets 8-byte stores, otherwise byte stores (slow).
#pragma once

#if !defined(__CUDACC__)
#error "ferry/sdk/fingerprint_cuda.cuh holds device code: include it from .cu files (nvcc) only"
#endif

#include "ferry/sdk/xxh64.hpp"

#include <cstdint>

namespace ferry::sdk::fingerprint_cuda {

// C of docs/fingerprint.md (ferry::kernels::kFingerprintChunkBytes).
inline constexpr std::uint64_t kChunkBytes = 1ull << 20;
// Threads per hash: XXH64's four accumulators.
inline constexpr unsigned kGroup = 4;

// A read-only 8-byte load that asks L2 to fetch the whole 128-byte line from memory (the next
// stripes of the chunk then hit L2). Measured on an H200 (4096 x 4 MiB): 4.0 TB/s against 3.7
// with __ldg, 3.4 with L1::no_allocate.L2::256B; keeping L1 allocation doubles the misaligned
// path (its two aligned loads overlap the neighbouring thread's).
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
  unsigned shift;                   // unused (0)

  __device__ __forceinline__ Raw load(std::uint64_t s) const { return load_stream(words + 4 * s); }
  __device__ __forceinline__ std::uint64_t word(Raw raw) const { return raw; }
};

// Reads one accumulator's words from an input `shift / 8` bytes past an 8-byte boundary: each
// word is put together from the two aligned words that hold it. Both hold a byte of the word, so
// they lie in its pages (the loads cannot fault) although up to 7 of their bytes lie outside
// the range; those bytes are shifted out.
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

// Where one accumulator's words go once hashed: stripe s's word to the same offset (32 s + 8 k
// for accumulator k) of the destination, or nowhere.
struct NoStores {
  __device__ __forceinline__ void store(std::uint64_t, std::uint64_t) const {}
};
struct AlignedStores {
  unsigned long long* words;  // the thread's first word of an 8-byte aligned destination
  __device__ __forceinline__ void store(std::uint64_t s, std::uint64_t word) const {
    words[4 * s] = word;
  }
};
struct ByteStores {
  unsigned char* bytes;  // the thread's first byte of a destination of any alignment
  __device__ __forceinline__ void store(std::uint64_t s, std::uint64_t word) const {
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
      bytes[32 * s + i] = static_cast<unsigned char>(word >> (8 * i));
    }
  }
};

// Runs one XXH64 accumulator over `stripes` stripes, handing each word to `out` after hashing it.
// Every word is loaded kDepth stripes before its use, so the loads overlap the dependent chain of
// accumulate steps (stores wait on nothing, so they do not shorten the ring).
template <class Words, class Stores>
__device__ __forceinline__ std::uint64_t run_accumulator(const Words& in, std::uint64_t stripes,
                                                         std::uint64_t acc, const Stores& out) {
  constexpr unsigned kDepth = Words::kDepth;
  std::uint64_t s = 0;  // stripes accumulated so far
  if (stripes >= kDepth) {
    typename Words::Raw ring[kDepth];  // ring[u] holds stripe s + u
#pragma unroll
    for (unsigned u = 0; u < kDepth; ++u) ring[u] = in.load(u);
    for (; s + 2 * kDepth <= stripes; s += kDepth) {
#pragma unroll
      for (unsigned u = 0; u < kDepth; ++u) {
        const std::uint64_t word = in.word(ring[u]);
        acc = xxh64::accumulate(acc, word);
        out.store(s + u, word);
        ring[u] = in.load(s + kDepth + u);
      }
    }
#pragma unroll
    for (unsigned u = 0; u < kDepth; ++u) {
      const std::uint64_t word = in.word(ring[u]);
      acc = xxh64::accumulate(acc, word);
      out.store(s + u, word);
    }
    s += kDepth;
  }
  for (; s < stripes; ++s) {
    const std::uint64_t word = in.word(in.load(s));
    acc = xxh64::accumulate(acc, word);
    out.store(s, word);
  }
  return acc;
}

// Runs accumulator `lane` over `stripes` stripes of `p` (any alignment), words to `out`.
template <class Stores>
__device__ __forceinline__ std::uint64_t run_lane(const unsigned char* p, std::uint64_t stripes,
                                                  std::uint64_t acc, unsigned lane,
                                                  const Stores& out) {
  const auto misalignment = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(p) & 7u);
  if (misalignment == 0) {
    const AlignedWords in{reinterpret_cast<const unsigned long long*>(p) + lane, 0};
    return run_accumulator(in, stripes, acc, out);
  }
  const MisalignedWords in{reinterpret_cast<const unsigned long long*>(p - misalignment) + lane,
                           8 * misalignment};
  return run_accumulator(in, stripes, acc, out);
}

// group_hash's destination: none (the plain hash) or a copy of the hashed bytes to `dst`.
struct NoCopy {
  static constexpr bool kCopies = false;
};
struct CopyTo {
  static constexpr bool kCopies = true;
  unsigned char* dst;  // receives the `len` bytes hashed; null only when the thread is inactive
};

// XXH64 of `len` bytes at `p` with `seed` by the group of the calling thread (`lane` = 0..3
// within the group), and with CopyTo{dst} the copy of those bytes to `dst`; see the contract at
// the top of this file.
template <class Destination = NoCopy>
__device__ inline std::uint64_t group_hash(const unsigned char* p, std::uint64_t len,
                                           std::uint64_t seed, unsigned lane, bool active,
                                           Destination destination = {}) {
  const std::uint64_t stripes = active ? len / xxh64::kStripeBytes : 0;
  std::uint64_t acc = xxh64::initial_accumulator(static_cast<int>(lane), seed);
  // Every branch here rejoins before the shuffles below: groups of one warp may take different
  // ones (their ranges' alignments differ).
  if constexpr (Destination::kCopies) {
    unsigned char* dst = destination.dst;
    if ((reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0) {
      acc = run_lane(p, stripes, acc, lane,
                     AlignedStores{reinterpret_cast<unsigned long long*>(dst) + lane});
    } else {
      acc = run_lane(p, stripes, acc, lane, ByteStores{dst + 8 * lane});
    }
  } else {
    acc = run_lane(p, stripes, acc, lane, NoStores{});
  }
  const unsigned first = (threadIdx.x % 32) & ~(kGroup - 1);
  std::uint64_t v[kGroup];
#pragma unroll
  for (unsigned i = 0; i < kGroup; ++i) {
    v[i] = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(acc), first + i);
  }
  if (!active || lane != 0) return 0;
  const std::uint64_t striped = stripes * xxh64::kStripeBytes;
  if constexpr (Destination::kCopies) {
    for (std::uint64_t i = striped; i < len; ++i) destination.dst[i] = p[i];
  }
  const std::uint64_t h = len >= xxh64::kStripeBytes ? xxh64::converge(v) : seed + xxh64::kPrime5;
  return xxh64::finish(h, len, p + striped, len - striped);
}

}  // namespace ferry::sdk::fingerprint_cuda
