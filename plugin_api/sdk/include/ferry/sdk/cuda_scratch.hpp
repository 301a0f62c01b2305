// ferry/sdk/cuda_scratch.hpp: stream-ordered scratch memory for a kernel launch (its op table,
// its per-chunk hashes, its results) from a CUDA memory pool that keeps the memory it grew to.
// Shared by ferry's kernels (kernels/cuda), its sessions (host/session) and transport plugins
// (plugins/cuda_ipc). Header-only host code.
//
// Why not cudaMallocAsync: it takes from the device's default pool, whose release threshold is
// 0, so at every synchronisation (a push waiting for its producers, a flush waiting for its
// copies) the pool gives its free memory back to the driver, and the next allocation maps new
// physical memory. On an H100, right after another process released and resumed 16 GB, that
// allocation took 5-9 ms where the pool's own memory takes microseconds (docs/benchmarks.md,
// "Scratch memory that stays", session 33). The default pool is the whole process's (a trainer's
// own cudaMallocAsync calls use it too), so it is left as it is.
//
// Contract:
//  - scratch_alloc_async() allocates `bytes` ordered on `stream`, from the scratch pool of the
//    stream's device; the memory is given back with cudaFreeAsync, as from cudaMallocAsync.
//  - One pool per device and per shared library that includes this header, created on first use
//    and kept until the process exits. It keeps at most the peak of scratch in use at once
//    (kilobytes to a few megabytes). Where a pool cannot be created, the device's default pool
//    serves, as before.
//
// Threading: any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace ferry::sdk {

// The scratch pool of CUDA `device`, or nullptr where none could be created.
inline cudaMemPool_t scratch_pool(int device) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, cudaMemPool_t>();  // kept until exit: no CUDA calls then
  std::lock_guard lock(mutex);
  if (auto it = pools->find(device); it != pools->end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    (void)cudaGetLastError();
    pool = nullptr;
  } else {
    std::uint64_t keep = UINT64_MAX;  // never given back at a synchronisation
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  (*pools)[device] = pool;
  return pool;
}

// cudaMallocAsync's contract, from the scratch pool of `stream`'s device.
inline cudaError_t scratch_alloc_async(void** ptr, std::size_t bytes, cudaStream_t stream) {
  int device = 0;
  const cudaError_t err = cudaStreamGetDevice(stream, &device);
  if (err != cudaSuccess) return err;
  cudaMemPool_t pool = scratch_pool(device);
  if (pool == nullptr) return cudaMallocAsync(ptr, bytes, stream);
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

}  // namespace ferry::sdk
