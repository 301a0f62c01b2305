// ckpt_engine/cuda_buffer.cpp: the CUDA IPC opener of the checkpoint-engine shared buffer
// (cuda_buffer.hpp), and its refusal when the build has no CUDA.
#include "ckpt_engine/cuda_buffer.hpp"

#include <ferry/formats/torch_reductions.hpp>
#include <ferry/sdk/error.hpp>

#include <cstdint>
#include <cstring>
#include <string>

#if FERRY_CKPT_ENGINE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry::ckpt_engine {

#if FERRY_CKPT_ENGINE_CUDA

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(e == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_IO,
         "checkpoint-engine buffer: {}: {}", what, cudaGetErrorString(e));
  }
}

class CudaIpcOpener final : public SharedBufferOpener {
 public:
  explicit CudaIpcOpener(int device) : device_(device) {}
  ~CudaIpcOpener() override {
    close();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const std::byte* open(const IpcBufferHandle& h) override {
    close();
    if (h.handle_format == CudaHandleFormat::expandable_segment) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "the ParameterServer's buffer is a torch expandable segment "
           "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); ferry opens cudaMalloc blocks "
           "only: run the ParameterServer without expandable segments");
    }
    const std::uint64_t bytes = h.buffer_bytes();
    if (h.tensor_offset > h.storage_size_bytes ||
        bytes > h.storage_size_bytes - h.tensor_offset ||
        h.storage_offset_bytes > UINT64_MAX - h.storage_size_bytes) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "IPC handle: buffer of {} bytes at tensor offset {} does not fit its storage of {} bytes",
           bytes, h.tensor_offset, h.storage_size_bytes);
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (stream_ == nullptr) {
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    cudaIpcMemHandle_t handle{};
    static_assert(sizeof(handle) == 64);
    std::memcpy(&handle, h.ipc_mem_handle.data(), sizeof(handle));
    void* base = nullptr;
    check_cuda(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle (is the ParameterServer on this node, and the handle for "
               "this GPU?)");
    base_ = base;
    ref_file_ = h.ref_counter_handle;
    ref_slot_ = h.ref_counter_offset;
    return static_cast<const std::byte*>(base) + h.storage_offset_bytes + h.tensor_offset;
  }

  void close() noexcept override {
    if (base_ == nullptr) return;
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(base_);
    base_ = nullptr;
    // Lets the ParameterServer's ipc_collect() free the buffer after every update.
    torch_reductions::release_cuda_ipc_reference(ref_file_, ref_slot_);
    ref_file_.clear();
  }

  void copy_out(void* dst, const std::byte* src, std::uint64_t bytes) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
               "copying a bucket out of the shared buffer");
    check_cuda(cudaStreamSynchronize(stream_), "copying a bucket out of the shared buffer");
  }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* base_ = nullptr;
  std::string ref_file_;
  std::uint64_t ref_slot_ = 0;
};

}  // namespace

std::unique_ptr<SharedBufferOpener> make_cuda_ipc_opener(int device) {
  return std::make_unique<CudaIpcOpener>(device);
}

#else  // no CUDA in this build

namespace {
class NoCudaOpener final : public SharedBufferOpener {
 public:
  const std::byte* open(const IpcBufferHandle&) override {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "this ferry was built without CUDA: it cannot open the checkpoint-engine CUDA IPC buffer");
  }
  void close() noexcept override {}
  void copy_out(void*, const std::byte*, std::uint64_t) override {
    fail(FERRY_STATUS_UNIMPLEMENTED, "this ferry was built without CUDA");
  }
};
}  // namespace

std::unique_ptr<SharedBufferOpener> make_cuda_ipc_opener(int) {
  return std::make_unique<NoCudaOpener>();
}

#endif

}  // namespace ferry::ckpt_engine
