// ferry/formats/torch_reductions.hpp: tensors as torch.multiprocessing's reductions pickle them
// (ForkingPickler: what checkpoint-engine's ParameterServer and SGLang's MultiprocessingSerializer
// send), decoded from the restricted pickle reader's value tree into plain structs. Nothing is
// opened or mapped here: the structs say where the bytes are (a CUDA IPC handle, a shared-memory
// file), and the consumer imports them.
//
// What torch emits:
// - a CUDA tensor: rebuild_cuda_tensor(tensor_cls, size, stride, tensor_offset, storage_cls,
//   dtype, device, storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad,
//   ref_counter_handle, ref_counter_offset, event_handle, event_sync_required); SGLang's
//   patch (sglang.srt.utils.patch_torch._rebuild_cuda_tensor_modified) passes the device as its
//   UUID string instead of an index.
// - a CPU tensor: rebuild_tensor(tensor_cls, storage, (storage_offset, size, stride,
//   requires_grad)) with storage = rebuild_typed_storage(<untyped storage>, dtype), where the
//   untyped storage is rebuild_storage_filename(cls, manager, name, size) under the file_system
//   sharing strategy (a file of /dev/shm any process of the host may open), or
//   rebuild_storage_fd(cls, DupFd, size) under file_descriptor (the default on Linux: the fd is
//   handed over by the sending process's multiprocessing resource sharer, which only answers
//   processes of its own family, authenticated by its authkey): refused, naming why.
//
// Errors: ferry::Error(FERRY_STATUS_CORRUPT_DATA) naming `owner`, the field and the rule.
// Threading: pure functions.
#pragma once

#include <ferry/plugin.h>
#include <ferry/formats/pickle_reader.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ferry::torch_reductions {

using ckpt_engine::Value;

// How torch serialized the CUDA allocation's handle (storage_handle).
enum class CudaHandleFormat : std::uint8_t {
  legacy_ipc_mem_handle,  // 64 raw bytes of cudaIpcMemHandle_t (older torch)
  cuda_malloc,            // version byte, 'c', 64 bytes of cudaIpcMemHandle_t
  expandable_segment,     // version byte, 'e', then torch's expandable-segment data (fd based)
};

// The 15 arguments of rebuild_cuda_tensor, validated. Units: size/stride/tensor_offset in
// elements; every *_bytes and *_offset field in bytes.
struct CudaIpcTensor {
  std::string tensor_class;           // "torch.Tensor" (or "torch.nn.parameter.Parameter")
  std::vector<std::uint64_t> size;    // tensor.size()
  std::vector<std::uint64_t> stride;  // tensor.stride()
  std::uint64_t tensor_offset = 0;    // tensor.storage_offset()
  std::string storage_class;          // "torch.storage.TypedStorage", ...
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::int64_t device = 0;     // the sender's device index (-1 when given by UUID)
  std::string device_uuid;     // SGLang's patched form: the device's UUID, else ""
  std::string storage_handle;  // raw bytes as torch wrote them
  CudaHandleFormat handle_format = CudaHandleFormat::legacy_ipc_mem_handle;
  std::uint8_t handle_version = 0;  // torch's SHAREABLE_HANDLE_VERSION; 0 for the legacy form
  // The cudaIpcMemHandle_t bytes (legacy and cuda_malloc formats); zero for expandable segments.
  std::array<std::uint8_t, 64> ipc_mem_handle{};
  std::uint64_t storage_size_bytes = 0;    // size of the storage
  std::uint64_t storage_offset_bytes = 0;  // where the storage starts in the cudaMalloc block
  bool requires_grad = false;
  std::string ref_counter_handle;  // shared-memory file name of torch's IPC ref counter
  std::uint64_t ref_counter_offset = 0;
  std::optional<std::string> event_handle;  // cudaIpcEventHandle_t bytes (64), when sent
  bool event_sync_required = false;
};

// The callee names of a CUDA tensor's rebuild: torch's, and SGLang's patched one.
bool is_cuda_rebuild(std::string_view callee) noexcept;

// Decodes the argument tuple (or call node's arguments) of a CUDA tensor's rebuild. Checks the
// types and that the tensor (size, stride, offset) lies inside its storage.
CudaIpcTensor decode_cuda_ipc_tensor(const Value& args, std::string_view owner);

// A CPU storage in a shared-memory file (the file_system sharing strategy): shm_open(name).
struct SharedMemoryFile {
  std::string manager;  // torch_shm_manager's socket (not needed to read the file)
  std::string name;     // "/torch_<pid>_<random>_<n>"
  std::uint64_t size_bytes = 0;
};

// One tensor of a pickle, wherever its bytes are.
struct Tensor {
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> stride;  // elements
  std::uint64_t offset = 0;           // elements into the storage
  std::variant<CudaIpcTensor, SharedMemoryFile> storage;

  // True when the elements are dense in row-major order (the only layout ferry copies).
  bool contiguous() const noexcept;
  // Bytes of the tensor (element count * dtype size), overflow-checked at decode.
  std::uint64_t bytes() const noexcept;
};

// Decodes a tensor value (a call of torch's rebuild_cuda_tensor / rebuild_tensor). The file
// descriptor strategy and anything else are refused naming why.
Tensor decode_tensor(const Value& value, std::string_view owner);

// What a consumer of a CUDA tensor owes its producer once it is done with the storage: torch's
// producer keeps the shared block alive while a counter in a shared-memory file of int64 slots
// (ref_counter_handle, slot ref_counter_offset) is non-zero, and each consumer decrements its
// slot when it drops the storage (what torch's own rebuild does). Call it once per received
// tensor. A file that is gone already (the producer removed it) holds nothing. Never throws.
void release_cuda_ipc_reference(const std::string& ref_counter_handle,
                                std::uint64_t ref_counter_offset) noexcept;

// "torch.bfloat16" -> FERRY_DTYPE_BF16; refused (naming `owner`) for a dtype ferry lacks.
ferry_dtype_t torch_dtype(const Value& value, std::string_view owner);

// torch.Size(tuple) (a REDUCE of torch.Size), or a tuple/list of non-negative ints.
std::vector<std::uint64_t> torch_dims(const Value& value, std::string_view field);

}  // namespace ferry::torch_reductions
