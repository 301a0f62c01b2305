// receiver/torch_tensor_import.hpp: copies the bytes of a tensor another process shared by
// torch's multiprocessing reductions (<ferry/formats/torch_reductions.hpp>) into host memory:
// a CPU tensor from its shared-memory file (opened read-only, mapped, copied, unmapped), a CUDA
// tensor through its CUDA IPC handle (opened on the device it names, copied device to host,
// closed). The sender keeps the tensor alive while its request runs; nothing is kept open after
// a copy returns, and a CUDA tensor's reference is given back to torch's producer (once).
//
// Errors: NOT_FOUND for a shared-memory file or GPU UUID that is not on this host, INVALID_ARGUMENT
// for a file smaller than its storage, UNIMPLEMENTED for CUDA tensors in a build without CUDA and
// for torch's expandable-segment handles (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False in
// the trainer), INTERNAL with the CUDA error otherwise. Threading: any thread.
#pragma once

#include <ferry/formats/torch_reductions.hpp>

#include <cstdint>
#include <span>

namespace ferry::receiver {

// Bytes [byte_offset, byte_offset + bytes) of a tensor's (contiguous) elements, copied to dst.
struct SharedTensorRange {
  std::uint64_t byte_offset = 0;
  std::uint64_t bytes = 0;
  void* dst = nullptr;
};

// Opens `tensor` once and copies every range of `ranges` out of it.
void copy_shared_tensor(const torch_reductions::Tensor& tensor,
                        std::span<const SharedTensorRange> ranges);

// Gives a CUDA tensor's reference back to its producer (torch_reductions::
// release_cuda_ipc_reference); nothing for a shared-memory file. Once per received tensor,
// whether it was copied or not.
void release_shared_tensor(const torch_reductions::Tensor& tensor) noexcept;

}  // namespace ferry::receiver
