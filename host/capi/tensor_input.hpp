// capi/tensor_input.hpp: reads the named tensors the C API is given (ferry_tensor_t: a DLPack
// DLTensor or a plain view) into checked values: known dtype, row-major contiguous memory, a
// device ferry can read, unique names. Every rule broken is one INVALID_ARGUMENT naming the tensor.
#pragma once

#include <ferry/ferry.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::capi {

struct TensorInput {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  void* data = nullptr;  // first element (DLPack byte_offset applied)
  ferry_memory_kind_t memory_kind = FERRY_MEMORY_HOST;
  int device = 0;
};

// The ferry dtype of a DLPack dtype, or FERRY_DTYPE_INVALID when ferry has none for it.
ferry_dtype_t dtype_from_dlpack(DLDataType dtype) noexcept;

// Checks and reads tensor `index` of a call to `function` (used in messages:
// "ferry_sender_push: tensor 3 'layers.0.w': strides [1, 4] are not row-major contiguous ...").
TensorInput read_tensor(const ferry_tensor_t* tensor, std::size_t index, const char* function);

// Reads `count` tensors and refuses a name that appears twice.
std::vector<TensorInput> read_tensors(const ferry_tensor_t* const* tensors, std::size_t count,
                                      const char* function);

}  // namespace ferry::capi
