// ckpt_engine/messages.hpp: the messages a checkpoint-engine ParameterServer sends to a worker,
// as plain C++ structs, and the decoder from pickle bytes (via the restricted reader) to them.
//
// The structs carry exactly what the wire carries, validated (types, ranges, overflow-checked
// sizes); they hold no CUDA or ZMQ state, so the GPU transport can open the IPC handle and copy
// from the buffer without knowing anything about pickles. See PROTOCOL.md for the sequence.
#pragma once

#include <ferry/formats/pickle_reader.hpp>
#include <ferry/formats/torch_reductions.hpp>

#include <ferry/plugin.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace ferry::ckpt_engine {

using torch_reductions::CudaHandleFormat;

// The first message: torch.multiprocessing.reductions.reduce_tensor() of the sender's shared
// double buffer, i.e. (rebuild_cuda_tensor, args) with the 15 arguments of rebuild_cuda_tensor
// (decoded by <ferry/formats/torch_reductions.hpp>), checked to be a flat torch.uint8 buffer.
struct IpcBufferHandle : torch_reductions::CudaIpcTensor {
  // Bytes of the buffer the buckets index into (size[0] * 1 byte).
  std::uint64_t buffer_bytes() const noexcept { return size.empty() ? 0 : size[0]; }
};

// One entry of a bucket: checkpoint-engine's FlattenedTensorMetadata, a dict
// {"name": str, "dtype": torch.dtype, "shape": torch.Size, "offset": int}.
struct BucketTensor {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;  // <= FERRY_MAX_DIMS dims; empty for a scalar
  std::uint64_t offset = 0;          // byte offset in the shared buffer
  std::uint64_t bytes = 0;           // element count * dtype size (overflow-checked)
};

// A bucket: the list the ParameterServer sends after it filled one half of the buffer.
struct BucketMeta {
  std::vector<BucketTensor> tensors;
  std::uint64_t begin = 0;  // lowest offset (0 when empty)
  std::uint64_t end = 0;    // highest offset + bytes (0 when empty)
};

// None: the ParameterServer's "done" signal. In checkpoint-engine 0.4.2 it comes twice: first
// "release the buffer", then "run post-processing and finish" (WorkerSession tells them apart).
struct EndSignal {};

// A pickled exception: the ParameterServer tells workers to abort ("Some workers failed to
// update weights").
struct AbortRequest {
  std::string exception;  // "RuntimeError"
  std::string text;       // its first str argument, or "" when it had none
};

using Message = std::variant<IpcBufferHandle, BucketMeta, EndSignal, AbortRequest>;

// Decodes one ZMQ message body. Throws ferry::Error(FERRY_STATUS_CORRUPT_DATA) naming the field
// and the rule when the pickle is refused or does not have the shape of a protocol message.
Message decode_message(std::span<const std::uint8_t> bytes, const PickleLimits& limits = {});

// The same, from an already read value tree.
Message decode_message(const Value& root);
IpcBufferHandle decode_ipc_handle(const Value& root);
BucketMeta decode_bucket(const Value& root);

// Checks that every tensor lies inside a buffer of `buffer_bytes` and that no two overlap.
// Throws ferry::Error(FERRY_STATUS_CORRUPT_DATA) naming the tensor(s).
void check_bucket_in_buffer(const BucketMeta& bucket, std::uint64_t buffer_bytes);

}  // namespace ferry::ckpt_engine
