// bench/common/cuda.cpp: the checked CUDA calls and owning handles of `ferry bench` (cuda.hpp).
#include "bench/common/cuda.hpp"

#include <ferry/sdk/error.hpp>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "bench/common/fill.hpp"

namespace ferry::bench {
namespace {

// The NVIDIA kernel module version ("580.159.04"): the first dotted number on the first line of
// /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
// 580.159.04  Release Build ..."), or "" where /proc does not tell.
std::string nvidia_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return "";
  std::istringstream words(line);
  std::string word;
  while (words >> word) {
    const bool dotted = word.find('.') != std::string::npos &&
                        word.find_first_not_of("0123456789.") == std::string::npos &&
                        std::isdigit(static_cast<unsigned char>(word.front())) != 0;
    if (dotted) return word;
  }
  return "";
}

std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

void cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const ferry_status_code_t code = err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY
                                                                    : FERRY_STATUS_INTERNAL;
  fail(code, "{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

void select_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "no usable CUDA device: cudaGetDeviceCount says {} ({}); use --device cpu on a machine "
         "without a GPU",
         cudaGetErrorString(err), cudaGetErrorName(err));
  }
  if (count == 0) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "no CUDA device is visible (CUDA_VISIBLE_DEVICES?); use --device cpu on a machine without "
         "a GPU");
  }
  cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda_check(cudaFree(nullptr), "creating the CUDA context on device 0");
}

Json gpu_description() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0;
  int runtime = 0;
  cuda_check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  cuda_check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  Json gpu;
  gpu["name"] = prop.name;
  gpu["device"] = device;
  gpu["memory_bytes"] = static_cast<std::uint64_t>(prop.totalGlobalMem);
  gpu["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  gpu["multiprocessors"] = prop.multiProcessorCount;
  const std::string module = nvidia_driver_version();
  gpu["driver_version"] = module.empty() ? Json(nullptr) : Json(module);
  gpu["cuda_driver_api"] = cuda_version_text(driver);
  gpu["cuda_runtime"] = cuda_version_text(runtime);
  return gpu;
}

DeviceBuffer::DeviceBuffer(std::uint64_t bytes, const char* what) : size_(bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky allocation error
    fail(err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "cudaMalloc of {} bytes for the {}: {} ({})", bytes, what, cudaGetErrorString(err),
         cudaGetErrorName(err));
  }
  data_ = static_cast<std::byte*>(p);
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) (void)cudaFree(data_);
  data_ = nullptr;
  size_ = 0;
}

PinnedBuffer::PinnedBuffer(std::uint64_t bytes, const char* what) : size_(bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FERRY_STATUS_OUT_OF_MEMORY, "cudaMallocHost of {} bytes for the {}: {} ({})", bytes,
         what, cudaGetErrorString(err), cudaGetErrorName(err));
  }
  data_ = static_cast<std::byte*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}

Stream::Stream() {
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

void Stream::synchronize(const char* what) const {
  cuda_check(cudaStreamSynchronize(stream_), what);
}

Event::Event() { cuda_check(cudaEventCreate(&event_), "cudaEventCreate"); }

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) {
  cuda_check(cudaEventRecord(event_, stream), "cudaEventRecord");
}

double elapsed_seconds(const Event& start, const Event& end) {
  cuda_check(cudaEventSynchronize(end.get()), "waiting for the timed work (cudaEventSynchronize)");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start.get(), end.get()), "cudaEventElapsedTime");
  return static_cast<double>(ms) / 1e3;
}

void fill_pattern_cuda(void* data, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream) {
  cuda_check(launch_fill_pattern(data, bytes, seed, stream), "launching the source fill kernel");
}

DeviceMemory device_memory() {
  std::size_t free = 0;
  std::size_t total = 0;
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return {free, total};
}

}  // namespace ferry::bench
