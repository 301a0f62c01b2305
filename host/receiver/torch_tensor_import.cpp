// receiver/torch_tensor_import.cpp: the bytes of a tensor shared by torch's reductions, copied
// into host memory (see torch_tensor_import.hpp).
#include "receiver/torch_tensor_import.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ferry_build_config.h"

#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>

#include "receiver/gpu_uuid.hpp"
#endif

namespace ferry::receiver {
namespace {

using torch_reductions::CudaIpcTensor;
using torch_reductions::SharedMemoryFile;

// torch's refcounted map allocator (the file_system strategy) keeps its reference count in the
// first 64 bytes of the file (its alignment); the storage's bytes follow.
constexpr std::uint64_t kShmHeaderBytes = 64;

void check_range(const torch_reductions::Tensor& t, std::uint64_t storage_bytes,
                 std::uint64_t byte_offset, std::uint64_t bytes) {
  const auto start = checked_mul(t.offset, dtype_size(t.dtype));
  const auto begin = start ? checked_add(*start, byte_offset) : std::nullopt;
  const auto end = begin ? checked_add(*begin, bytes) : std::nullopt;
  if (!end || byte_offset + bytes > t.bytes() || *end > storage_bytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "shared tensor: bytes [{}, +{}) lie outside its {} bytes or its storage of {} bytes",
         byte_offset, bytes, t.bytes(), storage_bytes);
  }
}

void copy_from_file(const torch_reductions::Tensor& t, const SharedMemoryFile& f,
                    std::span<const SharedTensorRange> ranges) {
  for (const auto& r : ranges) check_range(t, f.size_bytes, r.byte_offset, r.bytes);
  if (ranges.empty()) return;
  const int fd = shm_open(f.name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    fail(errno == ENOENT ? FERRY_STATUS_NOT_FOUND : FERRY_STATUS_IO,
         "shared tensor: shm_open('{}'): {} (is the trainer on this host, and the tensor still "
         "alive while the request runs?)",
         f.name, std::strerror(errno));
  }
  struct stat st {};
  const std::uint64_t mapped = f.size_bytes + kShmHeaderBytes;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) < mapped) {
    close(fd);
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "shared tensor: '{}' is not a torch shared-memory file of at least {} bytes", f.name,
         mapped);
  }
  void* map = mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    fail(FERRY_STATUS_IO, "shared tensor: mmap('{}', {} bytes): {}", f.name, f.size_bytes,
         std::strerror(errno));
  }
  const auto* data =
      static_cast<const std::byte*>(map) + kShmHeaderBytes + t.offset * dtype_size(t.dtype);
  for (const auto& r : ranges) std::memcpy(r.dst, data + r.byte_offset, r.bytes);
  munmap(map, mapped);
}

#if FERRY_HAVE_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_INTERNAL, "shared CUDA tensor: {}: {}", what, cudaGetErrorString(e));
  }
}

int local_device(const CudaIpcTensor& h) {
  if (h.device_uuid.empty()) return static_cast<int>(h.device);
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    unsigned char raw[16];
    std::memcpy(raw, prop.uuid.bytes, 16);
    const std::string with_prefix = ckpt_engine::format_gpu_uuid(raw);  // "GPU-..."
    if (h.device_uuid == with_prefix || h.device_uuid == with_prefix.substr(4)) return d;
  }
  fail(FERRY_STATUS_NOT_FOUND, "shared CUDA tensor: no GPU of this host has UUID '{}'",
       h.device_uuid);
}
#endif

void copy_from_cuda(const torch_reductions::Tensor& t, const CudaIpcTensor& h,
                    std::span<const SharedTensorRange> ranges) {
  for (const auto& r : ranges) check_range(t, h.storage_size_bytes, r.byte_offset, r.bytes);
#if FERRY_HAVE_CUDA
  if (h.handle_format == torch_reductions::CudaHandleFormat::expandable_segment) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "shared CUDA tensor: torch's expandable-segment handles are not supported; start the "
         "trainer with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False");
  }
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  const int device = local_device(h);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == 64);
  std::memcpy(&handle, h.ipc_mem_handle.data(), sizeof(handle));
  void* base = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaSetDevice(previous);
    check_cuda(e, "cudaIpcOpenMemHandle (is the trainer on this host?)");
  }
  if (h.event_handle && h.event_sync_required) {
    // The producer's work on the tensor: wait for it before reading (torch records this event).
    cudaIpcEventHandle_t event_handle;
    std::memcpy(&event_handle, h.event_handle->data(), sizeof(event_handle));
    cudaEvent_t event = nullptr;
    e = cudaIpcOpenEventHandle(&event, event_handle);
    if (e == cudaSuccess) e = cudaEventSynchronize(event);
    if (event != nullptr) cudaEventDestroy(event);
  }
  const auto* src =
      static_cast<const std::byte*>(base) + h.storage_offset_bytes + t.offset * dtype_size(t.dtype);
  for (const auto& r : ranges) {
    if (e != cudaSuccess) break;
    if (r.bytes > 0) e = cudaMemcpy(r.dst, src + r.byte_offset, r.bytes, cudaMemcpyDeviceToHost);
  }
  cudaIpcCloseMemHandle(base);
  cudaSetDevice(previous);
  check_cuda(e, "copy from the trainer's tensor");
#else
  (void)t;
  (void)h;
  (void)ranges;
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "shared CUDA tensor: this ferry was built without CUDA; CUDA tensors cannot be imported");
#endif
}

}  // namespace

void copy_shared_tensor(const torch_reductions::Tensor& tensor,
                        std::span<const SharedTensorRange> ranges) {
  if (const auto* f = std::get_if<SharedMemoryFile>(&tensor.storage)) {
    copy_from_file(tensor, *f, ranges);
  } else {
    copy_from_cuda(tensor, std::get<CudaIpcTensor>(tensor.storage), ranges);
  }
}

void release_shared_tensor(const torch_reductions::Tensor& tensor) noexcept {
  if (const auto* h = std::get_if<CudaIpcTensor>(&tensor.storage)) {
    torch_reductions::release_cuda_ipc_reference(h->ref_counter_handle, h->ref_counter_offset);
  }
}

}  // namespace ferry::receiver
