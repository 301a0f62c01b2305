// receiver/torch_tensor_import.cpp: a tensor shared by torch's reductions, opened in this
// process, read in place or copied into host memory (see torch_tensor_import.hpp).
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

// Bytes from the tensor's first element to the end of a storage of `storage_bytes`, or an
// INVALID_ARGUMENT naming why the tensor does not fit in it.
std::uint64_t storage_after_start(const torch_reductions::Tensor& t, std::uint64_t storage_bytes) {
  const auto start = checked_mul(t.offset, dtype_size(t.dtype));
  const auto end = start ? checked_add(*start, t.bytes()) : std::nullopt;
  if (!end || *end > storage_bytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "shared tensor: its {} bytes at element {} lie outside its storage of {} bytes",
         t.bytes(), t.offset, storage_bytes);
  }
  return storage_bytes - *start;
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

// Makes `device` current for the scope and restores the previous one.
struct DeviceScope {
  int previous = 0;
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous); }
};
#endif

}  // namespace

SharedTensorMapping::SharedTensorMapping(const torch_reductions::Tensor& tensor)
    : bytes_(tensor.bytes()) {
  if (const auto* f = std::get_if<SharedMemoryFile>(&tensor.storage)) {
    storage_end_ = storage_after_start(tensor, f->size_bytes);
    const int fd = shm_open(f->name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
      fail(errno == ENOENT ? FERRY_STATUS_NOT_FOUND : FERRY_STATUS_IO,
           "shared tensor: shm_open('{}'): {} (is the trainer on this host, and the tensor still "
           "alive while the request runs?)",
           f->name, std::strerror(errno));
    }
    struct stat st {};
    const std::uint64_t mapped = f->size_bytes + kShmHeaderBytes;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<std::uint64_t>(st.st_size) < mapped) {
      close(fd);
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "shared tensor: '{}' is not a torch shared-memory file of at least {} bytes", f->name,
           mapped);
    }
    void* map = mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
      fail(FERRY_STATUS_IO, "shared tensor: mmap('{}', {} bytes): {}", f->name, f->size_bytes,
           std::strerror(errno));
    }
    map_ = map;
    map_bytes_ = mapped;
    data_ = static_cast<const std::byte*>(map) + kShmHeaderBytes +
            tensor.offset * dtype_size(tensor.dtype);
    return;
  }
  const auto& h = std::get<CudaIpcTensor>(tensor.storage);
  storage_end_ = storage_after_start(tensor, h.storage_size_bytes);
#if FERRY_HAVE_CUDA
  if (h.handle_format == torch_reductions::CudaHandleFormat::expandable_segment) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "shared CUDA tensor: torch's expandable-segment handles are not supported; start the "
         "trainer with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False");
  }
  const int device = local_device(h);
  DeviceScope scope(device);
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == 64);
  std::memcpy(&handle, h.ipc_mem_handle.data(), sizeof(handle));
  void* base = nullptr;
  check_cuda(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle (is the trainer on this host?)");
  if (h.event_handle && h.event_sync_required) {
    // The producer's work on the tensor: wait for it before reading (torch records this event).
    cudaIpcEventHandle_t event_handle;
    std::memcpy(&event_handle, h.event_handle->data(), sizeof(event_handle));
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaIpcOpenEventHandle(&event, event_handle);
    if (e == cudaSuccess) e = cudaEventSynchronize(event);
    if (event != nullptr) cudaEventDestroy(event);
    if (e != cudaSuccess) {
      cudaIpcCloseMemHandle(base);
      check_cuda(e, "waiting for the producer's event");
    }
  }
  ipc_base_ = base;
  kind_ = FERRY_MEMORY_CUDA;
  device_ = device;
  data_ = static_cast<const std::byte*>(base) + h.storage_offset_bytes +
          tensor.offset * dtype_size(tensor.dtype);
#else
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "shared CUDA tensor: this ferry was built without CUDA; CUDA tensors cannot be imported");
#endif
}

SharedTensorMapping::~SharedTensorMapping() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
#if FERRY_HAVE_CUDA
  if (ipc_base_ != nullptr) {
    const DeviceScope scope(device_);
    cudaIpcCloseMemHandle(ipc_base_);
  }
#endif
}

namespace {

void check_range_in(std::uint64_t byte_offset, std::uint64_t bytes, std::uint64_t tensor_bytes,
                    std::uint64_t storage_end) {
  const auto end = checked_add(byte_offset, bytes);
  if (!end || *end > tensor_bytes || *end > storage_end) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "shared tensor: bytes [{}, +{}) lie outside its {} bytes or its storage", byte_offset,
         bytes, tensor_bytes);
  }
}

}  // namespace

void check_shared_range(const torch_reductions::Tensor& tensor, std::uint64_t byte_offset,
                        std::uint64_t bytes) {
  const std::uint64_t storage_bytes =
      std::holds_alternative<SharedMemoryFile>(tensor.storage)
          ? std::get<SharedMemoryFile>(tensor.storage).size_bytes
          : std::get<CudaIpcTensor>(tensor.storage).storage_size_bytes;
  check_range_in(byte_offset, bytes, tensor.bytes(), storage_after_start(tensor, storage_bytes));
}

void SharedTensorMapping::check_range(std::uint64_t byte_offset, std::uint64_t bytes) const {
  check_range_in(byte_offset, bytes, bytes_, storage_end_);
}

void SharedTensorMapping::copy_to_host(void* dst, std::uint64_t byte_offset,
                                       std::uint64_t bytes) const {
  check_range(byte_offset, bytes);
  if (bytes == 0) return;
  if (kind_ == FERRY_MEMORY_HOST) {
    std::memcpy(dst, data_ + byte_offset, bytes);
    return;
  }
#if FERRY_HAVE_CUDA
  const DeviceScope scope(device_);
  check_cuda(cudaMemcpy(dst, data_ + byte_offset, bytes, cudaMemcpyDeviceToHost),
             "copy from the trainer's tensor");
#endif
}

void release_shared_tensor(const torch_reductions::Tensor& tensor) noexcept {
  if (const auto* h = std::get_if<CudaIpcTensor>(&tensor.storage)) {
    torch_reductions::release_cuda_ipc_reference(h->ref_counter_handle, h->ref_counter_offset);
  }
}

}  // namespace ferry::receiver
