// receiver/torch_tensor_import.hpp: copies the bytes of a tensor another process shared by
// torch's multiprocessing reductions (<ferry/formats/torch_reductions.hpp>) into host memory:
// a CPU tensor from its shared-memory file (opened read-only, mapped, copied, unmapped), a CUDA
// tensor through its CUDA IPC handle (opened on the device it names, copied device to host,
// closed). The sender keeps the tensor alive while its request runs; nothing is kept open after
// a copy returns.
//
// Errors: NOT_FOUND for a shared-memory file or GPU UUID that is not on this host, INVALID_ARGUMENT
// for a file smaller than its storage, UNIMPLEMENTED for CUDA tensors in a build without CUDA and
// for torch's expandable-segment handles (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False in
// the trainer), INTERNAL with the CUDA error otherwise. Threading: any thread.
#pragma once

#include <ferry/formats/torch_reductions.hpp>

#include <cstdint>

namespace ferry::receiver {

// Copies bytes [byte_offset, byte_offset + bytes) of `tensor`'s (contiguous) elements to `dst`.
void copy_shared_tensor(const torch_reductions::Tensor& tensor, std::uint64_t byte_offset,
                        std::uint64_t bytes, void* dst);

}  // namespace ferry::receiver
