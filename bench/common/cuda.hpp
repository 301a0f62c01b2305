// bench/common/cuda.hpp: the CUDA pieces of `ferry bench` (built only with the cuda feature): every
// CUDA call checked and turned into a ferry::Error that names the call, owning handles for
// device memory, pinned host memory, streams and events, and the description of the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "bench/common/report.hpp"

namespace ferry::bench {

// Throws ferry::Error (OUT_OF_MEMORY for allocation failures, else INTERNAL) with
// "<what>: <cuda error string> (<cuda error name>)" unless err is cudaSuccess.
void cuda_check(cudaError_t err, const char* what);

// Makes device 0 (of CUDA_VISIBLE_DEVICES) current. Throws FAILED_PRECONDITION naming the reason
// when there is no usable device.
void select_cuda_device();

// The GPU of the current device: name, memory, compute capability, driver version (the NVIDIA
// kernel module's, from /proc/driver/nvidia/version, and the CUDA driver API), runtime version.
Json gpu_description();

// Device memory from cudaMalloc, freed on destruction. `what` names it in errors.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::uint64_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }
  void reset() noexcept;

 private:
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Page-locked host memory from cudaMallocHost, freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer(std::uint64_t bytes, const char* what);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// A non-blocking stream, destroyed (after synchronizing) on destruction.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  void synchronize(const char* what) const;

 private:
  cudaStream_t stream_ = nullptr;
};

// A timing event.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Seconds between two recorded events; waits for `end`.
double elapsed_seconds(const Event& start, const Event& end);

// Enqueues the fill of `bytes` bytes at device address `data` with fill_pattern_cpu's bytes.
void fill_pattern_cuda(void* data, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream);

// Free and total memory of the current device, in bytes.
struct DeviceMemory {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};
DeviceMemory device_memory();

}  // namespace ferry::bench
