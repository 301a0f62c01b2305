// bench/cuda_ipc/cuda_ipc_cuda.cpp: the CUDA pieces of `ferry bench cuda_ipc` (built with the cuda
// feature): the trainer's tensors in device memory (one cudaMalloc each, or carved from one;
// filled by the bench's fill kernel, fingerprinted on the device) and the flat D2D copy ceiling
// of the same bytes; the trainer's step of the RL loop (borrow_device_memory).
#include <ferry/kernels/cuda.hpp>
#include <ferry/sdk/error.hpp>

#include <vector>

#include "bench/common/cuda.hpp"
#include "bench/cuda_ipc/cuda_ipc.hpp"

namespace ferry::bench {
namespace {

class CudaTensors final : public SenderTensors {
 public:
  // One allocation per tensor, or (flat) every tensor carved from one allocation.
  CudaTensors(std::size_t count, std::uint64_t bytes, bool flat) : bytes_(bytes) {
    buffers_.reserve(flat ? 1 : count);
    if (flat) buffers_.emplace_back(bytes * count, "the sender's tensors");
    for (std::size_t i = 0; i < count && !flat; ++i) buffers_.emplace_back(bytes, "a sender tensor");
    for (std::size_t i = 0; i < count; ++i) {
      tensors_.push_back(flat ? buffers_[0].data() + i * bytes : buffers_[i].data());
    }
  }
  void fill(std::uint64_t seed) override {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      fill_pattern_cuda(tensors_[i], bytes_, seed * 1'000'003ull + i, stream_.get());
    }
    stream_.synchronize("filling the sender's tensors");
  }
  const void* data(std::size_t index) const override { return tensors_.at(index); }
  std::uint64_t fingerprint(std::size_t index) const override {
    return kernels::fingerprint_cuda(tensors_.at(index), bytes_, stream_.get());
  }
  ferry_memory_kind_t memory_kind() const override { return FERRY_MEMORY_CUDA; }
  std::size_t count() const override { return tensors_.size(); }

 private:
  std::uint64_t bytes_;
  Stream stream_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<std::byte*> tensors_;
};

}  // namespace

std::unique_ptr<SenderTensors> make_cuda_tensors(std::size_t count, std::uint64_t bytes,
                                                 bool flat) {
  return std::make_unique<CudaTensors>(count, bytes, flat);
}

std::vector<double> measure_copy_ceiling_cuda(std::uint64_t bytes, int repeat) {
  Watchdog::phase("cuda_ipc: the D2D copy ceiling");
  Stream stream;
  DeviceBuffer src(bytes, "the D2D ceiling's source");
  DeviceBuffer dst(bytes, "the D2D ceiling's destination");
  fill_pattern_cuda(src.data(), bytes, 77, stream.get());
  cuda_check(cudaMemsetAsync(dst.data(), 0xA5, bytes, stream.get()), "poisoning the D2D copy");
  cuda_check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()),
             "the warm-up D2D copy");
  stream.synchronize("the warm-up D2D copy");
  std::vector<double> runs;
  Event start;
  Event end;
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    cuda_check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice,
                               stream.get()),
               "the D2D copy");
    end.record(stream.get());
    runs.push_back(elapsed_seconds(start, end));
  }
  if (kernels::fingerprint_cuda(dst.data(), bytes, stream.get()) !=
      kernels::fingerprint_cuda(src.data(), bytes, stream.get())) {
    fail(FERRY_STATUS_CORRUPT_DATA, "bench cuda_ipc: the D2D ceiling's copy differs from its source");
  }
  return runs;
}

void borrow_device_memory(std::uint64_t bytes) {
  Stream stream;
  DeviceBuffer buffer(bytes, "the trainer's step buffer");
  cuda_check(cudaMemsetAsync(buffer.data(), 0x3C, bytes, stream.get()), "the trainer's step");
  stream.synchronize("the trainer's step");
}

}  // namespace ferry::bench
