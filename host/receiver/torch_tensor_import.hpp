// receiver/torch_tensor_import.hpp: a tensor another process shared by torch's multiprocessing
// reductions (<ferry/formats/torch_reductions.hpp>), opened in this process: a CPU tensor's
// shared-memory file mapped read-only, a CUDA tensor's IPC handle opened on the device it names
// (after the producer's event, when torch sent one). The update reads straight from there,
// or copies the bytes into host memory (SharedTensorMapping::copy_to_host). The sender
// keeps the tensor alive while its request runs; nothing stays open once the mapping is closed,
// and a CUDA tensor's reference is given back to torch's producer (once).
//
// Errors: NOT_FOUND for a shared-memory file or GPU UUID that is not on this host, INVALID_ARGUMENT
// for a file smaller than its storage, UNIMPLEMENTED for CUDA tensors in a build without CUDA and
// for torch's expandable-segment handles (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False in
// the trainer), INTERNAL with the CUDA error otherwise. Threading: any thread.
#pragma once

#include <ferry/formats/torch_reductions.hpp>
#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>

namespace ferry::receiver {

// Checks, from the tensor's description alone (nothing is opened), that bytes
// [byte_offset, +bytes) of its elements lie in the tensor and in its storage (INVALID_ARGUMENT).
void check_shared_range(const torch_reductions::Tensor& tensor, std::uint64_t byte_offset,
                        std::uint64_t bytes);

// One shared tensor, open for as long as the object lives (one at a time per storage: a request
// names each storage once). data() is the tensor's first element: host memory, or device memory
// of device() when kind() is FERRY_MEMORY_CUDA.
class SharedTensorMapping {
 public:
  explicit SharedTensorMapping(const torch_reductions::Tensor& tensor);
  ~SharedTensorMapping();
  SharedTensorMapping(const SharedTensorMapping&) = delete;
  SharedTensorMapping& operator=(const SharedTensorMapping&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  ferry_memory_kind_t kind() const noexcept { return kind_; }
  int device() const noexcept { return device_; }
  // Checks that bytes [byte_offset, +bytes) lie in the tensor and its storage (INVALID_ARGUMENT).
  void check_range(std::uint64_t byte_offset, std::uint64_t bytes) const;
  // Copies bytes [byte_offset, +bytes) of the tensor to host memory `dst` (after check_range).
  void copy_to_host(void* dst, std::uint64_t byte_offset, std::uint64_t bytes) const;

 private:
  const std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::uint64_t storage_end_ = 0;  // bytes from data_ to the end of its storage
  ferry_memory_kind_t kind_ = FERRY_MEMORY_HOST;
  int device_ = -1;
  void* map_ = nullptr;        // shared-memory file: the mapping
  std::uint64_t map_bytes_ = 0;
  [[maybe_unused]] void* ipc_base_ = nullptr;  // CUDA: the opened IPC allocation (CUDA builds)
};

// Gives a CUDA tensor's reference back to its producer (torch_reductions::
// release_cuda_ipc_reference); nothing for a shared-memory file. Once per received tensor,
// whether it was copied or not.
void release_shared_tensor(const torch_reductions::Tensor& tensor) noexcept;

}  // namespace ferry::receiver
