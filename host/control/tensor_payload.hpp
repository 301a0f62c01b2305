// control/tensor_payload.hpp: the body of SGLang's /update_weights_from_tensor, checked and its
// pickles decoded by the restricted reader (never executed): serialized_named_tensors (one
// base64 MultiprocessingSerializer pickle per TP rank; this receiver reads the entry of its
// tp_rank), load_format (null or "direct": a list of (name, tensor); "flattened_bucket": a dict
// {"flattened_tensor": uint8 tensor, "metadata": [FlattenedTensorMetadata]}), flush_cache,
// abort_all_requests, torch_empty_cache, weight_version, disable_draft_model.
//
// Errors: INVALID_ARGUMENT for the JSON fields, CORRUPT_DATA naming the byte offset or the field
// for a refused pickle. Threading: pure functions.
#pragma once

#include <ferry/formats/torch_reductions.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "receiver/engine_control.hpp"

namespace ferry::control {

// One named tensor: `bytes` bytes at byte `byte_offset` of source tensor `source`'s elements.
struct NamedTensorPiece {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::size_t source = 0;
  std::uint64_t byte_offset = 0;
  std::uint64_t bytes = 0;
};

struct TensorUpdateRequest {
  std::vector<torch_reductions::Tensor> sources;  // every source is contiguous
  std::vector<NamedTensorPiece> tensors;          // names unique
  std::optional<std::string> weight_version;
  receiver::UpdateEffects effects;
  std::string load_format;  // "direct" (also for null) or "flattened_bucket"
};

// Decodes the JSON body for the receiver of `tp_rank` in a group of `tp_size`.
TensorUpdateRequest parse_tensor_update(const nlohmann::json& body, std::uint32_t tp_rank,
                                        std::uint32_t tp_size);

// The pickle of one rank (after base64), decoded as `load_format`.
void decode_tensor_payload(const std::vector<std::uint8_t>& pickle, const std::string& load_format,
                           TensorUpdateRequest& out);

// Standard base64 (RFC 4648, '=' padding, no line breaks); INVALID_ARGUMENT naming `field`.
std::vector<std::uint8_t> decode_base64(const std::string& text, const std::string& field);

}  // namespace ferry::control
