// kernels/cuda/launch.hpp: the boundary between the host-side C++ (cuda_api.cpp: validation,
// errors) and the nvcc-compiled kernels (*.cu). Plain types only, so the .cu files need no fmt
// or SDK headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::kernels::cuda_detail {

// One op as the device executes it. A copy moves bytes (src_size = dst_size = 1, cols in bytes);
// a cast converts elements. The op covers rows x units_per_row work units; unit u of the op is
// row u / units_per_row, elements [k * unit_elems, min((k + 1) * unit_elems, cols)) with
// k = u % units_per_row.
struct DeviceOp {
  // The first source byte; in a prepared table, its offset from the bucket base the launch gives
  // (the kernel adds `src_base`, which is 0 for a one-shot table of absolute addresses).
  const unsigned char* src;
  unsigned char* dst;
  std::uint64_t src_stride;  // bytes between row starts
  std::uint64_t dst_stride;
  std::uint64_t rows;
  std::uint64_t cols;  // elements (bytes for a copy) per row
  std::uint64_t unit_elems;
  std::uint64_t units_per_row;
  std::uint64_t first_unit;  // exclusive prefix sum of the units of the ops before
  std::uint32_t src_dtype;   // ferry_dtype_t; 0 for a byte copy
  std::uint32_t dst_dtype;
  std::uint32_t src_size;    // bytes per element
  std::uint32_t dst_size;
  std::uint32_t aligned;     // 1 when every element address is aligned to its size
  std::uint32_t is_copy;
};

// Copies the table to the device and launches the scatter kernel on `stream`.
cudaError_t launch_scatter(const DeviceOp* host_ops, std::size_t num_ops,
                           std::uint64_t total_units, cudaStream_t stream);

// Launches the scatter kernel over a table already in device memory; every op's source address
// is `src_base` + its `src` field.
cudaError_t launch_scatter_table(const DeviceOp* device_ops, std::size_t num_ops,
                                 std::uint64_t total_units, std::uintptr_t src_base,
                                 cudaStream_t stream);

// One byte range to fingerprint (device address, length); its chunks numbered from first_index
// (launch_chunk_hashes; 0 for a fingerprint).
struct FingerprintRange {
  const void* data;
  std::uint64_t bytes;
  std::uint64_t first_index = 0;
};

// Launches the chunk hash kernel over every chunk of every range and the combine kernel (two
// launches however many ranges); writes range i's xxh64-interleaved-v1 to device_results[i]. The
// host array is copied (stream-ordered) before this returns. cudaErrorInvalidValue when the
// batch exceeds one grid (2^35 chunks).
cudaError_t launch_fingerprints(const FingerprintRange* ranges, std::size_t num_ranges,
                                std::uint64_t* device_results, cudaStream_t stream);
// The chunk kernel alone: range i's chunk hashes (numbered from its first_index), the ranges'
// one after the other, into device_hashes (one launch).
cudaError_t launch_chunk_hashes(const FingerprintRange* ranges, std::size_t num_ranges,
                                std::uint64_t* device_hashes, cudaStream_t stream);

}  // namespace ferry::kernels::cuda_detail
