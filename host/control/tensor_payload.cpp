// control/tensor_payload.cpp: SGLang's /update_weights_from_tensor body and its pickles (see
// tensor_payload.hpp).
#include "control/tensor_payload.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <set>

#include "control/requests.hpp"

namespace ferry::control {
namespace {

using ckpt_engine::describe;
using ckpt_engine::Value;
using ckpt_engine::ValueKind;
using nlohmann::json;

constexpr std::size_t kMaxNameBytes = 1024;

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) {
  fail(FERRY_STATUS_CORRUPT_DATA, "update_weights_from_tensor: {}",
       fmt::format(format, std::forward<Args>(args)...));
}

std::string tensor_name(const Value& v, std::size_t index) {
  if (!v.is(ValueKind::str) || v.text.empty() || v.text.size() > kMaxNameBytes ||
      v.text.find('\0') != std::string::npos) {
    bad("tensor {}: the name must be a non-empty str of at most {} bytes without NUL, got {}",
        index, kMaxNameBytes, describe(v));
  }
  return v.text;
}

std::size_t add_source(TensorUpdateRequest& out, const Value& v, const std::string& owner) {
  auto t = torch_reductions::decode_tensor(v, "update_weights_from_tensor: " + owner);
  if (!t.contiguous()) {
    bad("{}: size {} stride {} is not contiguous (send tensor.contiguous())", owner,
        shape_string(t.shape), shape_string(t.stride));
  }
  out.sources.push_back(std::move(t));
  return out.sources.size() - 1;
}

void decode_direct(const Value& root, TensorUpdateRequest& out) {
  if (!root.is(ValueKind::list) && !root.is(ValueKind::tuple)) {
    bad("load_format direct: the payload must be a list of (name, tensor), got {}", describe(root));
  }
  for (std::size_t i = 0; i < root.items.size(); ++i) {
    const Value& pair = *root.items[i];
    if (!pair.is(ValueKind::tuple) || pair.items.size() != 2) {
      bad("entry {} must be a (name, tensor) tuple, got {}", i, describe(pair));
    }
    NamedTensorPiece p;
    p.name = tensor_name(*pair.items[0], i);
    p.source = add_source(out, *pair.items[1], fmt::format("tensor '{}'", p.name));
    const auto& src = out.sources[p.source];
    p.dtype = src.dtype;
    p.shape = src.shape;
    p.bytes = src.bytes();
    out.tensors.push_back(std::move(p));
  }
}

std::uint64_t field_int(const Value& state, std::string_view key, const std::string& owner) {
  const Value* v = state.dict_get(key);
  if (v == nullptr || !v->is(ValueKind::integer) || v->integer < 0) {
    bad("{}: field '{}' must be a non-negative int", owner, key);
  }
  return static_cast<std::uint64_t>(v->integer);
}

void decode_flattened(const Value& root, TensorUpdateRequest& out) {
  if (!root.is(ValueKind::dict) || root.dict_size() != 2) {
    bad("load_format flattened_bucket: the payload must be a dict of flattened_tensor and "
        "metadata, got {}",
        describe(root));
  }
  const Value* flat = root.dict_get("flattened_tensor");
  const Value* meta = root.dict_get("metadata");
  if (flat == nullptr || meta == nullptr) {
    bad("flattened_bucket: the keys must be flattened_tensor and metadata (one is missing or "
        "repeated)");
  }
  const std::size_t src = add_source(out, *flat, "flattened_tensor");
  const auto& bucket = out.sources[src];
  if (bucket.dtype != FERRY_DTYPE_U8 || bucket.shape.size() != 1) {
    bad("flattened_tensor must be a 1-D torch.uint8 tensor, got {} of shape {}",
        dtype_name(bucket.dtype), shape_string(bucket.shape));
  }
  const std::uint64_t total = bucket.shape[0];
  if (!meta->is(ValueKind::list)) bad("metadata must be a list, got {}", describe(*meta));
  for (std::size_t i = 0; i < meta->items.size(); ++i) {
    const Value& m = *meta->items[i];
    const std::string owner = fmt::format("metadata[{}]", i);
    if (!m.is(ValueKind::call) ||
        m.text != "sglang.srt.weight_sync.tensor_bucket.FlattenedTensorMetadata" ||
        !m.items.empty() || m.state == nullptr || !m.state->is(ValueKind::dict)) {
      bad("{} must be a FlattenedTensorMetadata, got {}", owner, describe(m));
    }
    const Value& s = *m.state;
    if (s.dict_size() != 6)
      bad("{}: a FlattenedTensorMetadata has 6 fields, got {}", owner, s.dict_size());
    const Value* name = s.dict_get("name");
    const Value* shape = s.dict_get("shape");
    const Value* dtype = s.dict_get("dtype");
    if (name == nullptr || shape == nullptr || dtype == nullptr) {
      bad("{}: fields name, shape and dtype are required", owner);
    }
    NamedTensorPiece p;
    p.name = tensor_name(*name, i);
    const std::string who = fmt::format("tensor '{}'", p.name);
    p.dtype = torch_reductions::torch_dtype(*dtype, who);
    p.shape = torch_reductions::torch_dims(*shape, who + " shape");
    const auto start = field_int(s, "start_idx", who);
    const auto end = field_int(s, "end_idx", who);
    const auto numel = field_int(s, "numel", who);
    const auto size = byte_size(p.dtype, p.shape);
    // SGLang's bucket is uint8: start/end/numel count bytes.
    if (!size || end < start || end - start != *size || numel != *size || end > total) {
      bad("{}: bytes [{}, {}) (numel {}) do not hold a {} tensor of shape {} ({} bytes) inside "
          "the flattened tensor of {} bytes",
          who, start, end, numel, dtype_name(p.dtype), shape_string(p.shape), size.value_or(0),
          total);
    }
    p.source = src;
    p.byte_offset = start;
    p.bytes = *size;
    out.tensors.push_back(std::move(p));
  }
}

}  // namespace

std::vector<std::uint8_t> decode_base64(const std::string& text, const std::string& field) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} is not base64: its length {} is not a multiple of 4",
         field, text.size());
  }
  std::vector<std::uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = value(c)) < 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} is not base64: character {} at offset {}", field,
             static_cast<int>(static_cast<unsigned char>(c)), i + k);
      }
    }
    const std::uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<std::uint8_t>(w >> 16));
    if (pad < 2) out.push_back(static_cast<std::uint8_t>(w >> 8));
    if (pad < 1) out.push_back(static_cast<std::uint8_t>(w));
  }
  return out;
}

void decode_tensor_payload(const std::vector<std::uint8_t>& pickle, const std::string& load_format,
                           TensorUpdateRequest& out) {
  const auto root = ckpt_engine::read_pickle(pickle);
  if (load_format == "flattened_bucket") {
    decode_flattened(*root, out);
  } else {
    decode_direct(*root, out);
  }
  std::set<std::string_view> names;
  for (const auto& t : out.tensors) {
    if (!names.insert(t.name).second) bad("tensor '{}' is named twice", t.name);
  }
}

TensorUpdateRequest parse_tensor_update(const json& body, std::uint32_t tp_rank,
                                        std::uint32_t tp_size) {
  static constexpr const char* kRoute = "update_weights_from_tensor";
  TensorUpdateRequest r;
  auto it = body.find("serialized_named_tensors");
  if (it == body.end() || !it->is_array() || it->empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: field 'serialized_named_tensors' (a list of base64 strings, one per TP rank) is "
         "required",
         kRoute);
  }
  if (it->size() != tp_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: serialized_named_tensors has {} entries; this receiver's group has tp_size {} (one "
         "per TP rank)",
         kRoute, it->size(), tp_size);
  }
  const json& mine = (*it)[tp_rank];
  if (!mine.is_string()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: serialized_named_tensors[{}] must be a base64 string",
         kRoute, tp_rank);
  }
  const auto lf = body.find("load_format");
  if (lf == body.end() || lf->is_null()) {
    r.load_format = "direct";
  } else if (lf->is_string() &&
             (lf->get<std::string>() == "direct" || lf->get<std::string>() == "flattened_bucket")) {
    r.load_format = lf->get<std::string>();
  } else {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: load_format {} is not one ferry reads (null, 'direct' or 'flattened_bucket')", kRoute,
         lf->dump());
  }
  if (auto d = body.find("disable_draft_model"); d != body.end() && !d->is_null()) {
    if (!d->is_boolean()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field 'disable_draft_model' must be a boolean",
           kRoute);
    }
  }
  r.weight_version = weight_version_field(body);
  r.effects = parse_update_effects(body, kRoute);
  decode_tensor_payload(
      decode_base64(mine.get<std::string>(), fmt::format("serialized_named_tensors[{}]", tp_rank)),
      r.load_format, r);
  return r;
}

}  // namespace ferry::control
