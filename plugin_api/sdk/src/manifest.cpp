// Bucket manifests: validation rules, Cap'n Proto encoding and limit-checked decoding of
// untrusted bytes, plan signatures and ferry_tensor_desc_t views (see ferry/sdk/manifest.hpp).
#include "ferry/sdk/manifest.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "ferry/sdk/dtype.hpp"
#include "ferry/sdk/error.hpp"
#include "tensor_meta.capnp.h"

namespace ferry::manifest {
namespace {

constexpr std::uint16_t kLastDtype = FERRY_DTYPE_F8_E5M2;
constexpr std::size_t kWordBytes = sizeof(capnp::word);

// A name as it appears in messages: quoted, control bytes escaped, and cut to a readable length
// (a hostile manifest may carry megabyte names).
std::string quoted(std::string_view name) {
  constexpr std::size_t kShown = 80;
  std::string out = "'";
  for (std::size_t i = 0; i < name.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (name.size() > kShown) out += fmt::format("...({} bytes)", name.size());
  out += "'";
  return out;
}

template <typename... Args>
[[noreturn]] void tensor_fail(const Entry& entry, std::size_t index,
                              fmt::format_string<Args...> format, Args&&... args) {
  fail(FERRY_STATUS_CORRUPT_DATA, "manifest: tensor {} (index {}): {}", quoted(entry.name), index,
       fmt::format(format, std::forward<Args>(args)...));
}

bool known_dtype(std::uint32_t raw) noexcept {
  return raw > FERRY_DTYPE_INVALID && raw <= kLastDtype;
}

// Rules that concern one entry alone; returns the entry's end offset (offset + size).
std::uint64_t validate_entry(const Entry& e, std::size_t i, const Limits& limits) {
  if (e.name.empty()) tensor_fail(e, i, "empty name");
  if (e.name.size() > limits.max_name_bytes) {
    tensor_fail(e, i, "name of {} bytes exceeds the limit of {}", e.name.size(),
                limits.max_name_bytes);
  }
  // Names cross the C ABI as NUL-terminated strings; an embedded NUL would silently alias.
  if (e.name.find('\0') != std::string::npos) tensor_fail(e, i, "name contains a NUL byte");
  if (!known_dtype(static_cast<std::uint32_t>(e.dtype))) {
    tensor_fail(e, i, "unknown dtype {}", static_cast<std::uint32_t>(e.dtype));
  }
  if (e.shape.size() > limits.max_dims || e.shape.size() > FERRY_MAX_DIMS) {
    tensor_fail(e, i, "{} dims exceed the limit of {}", e.shape.size(),
                std::min<std::size_t>(limits.max_dims, FERRY_MAX_DIMS));
  }
  const std::size_t elem = dtype_size(e.dtype);
  const auto expected = byte_size(e.dtype, e.shape);
  if (!expected) {
    tensor_fail(e, i, "shape {} product * {} overflows uint64", shape_string(e.shape), elem);
  }
  if (e.size != *expected) {
    tensor_fail(e, i, "size {} != product(shape {}) * {} = {}", e.size, shape_string(e.shape),
                elem, *expected);
  }
  const auto end = checked_add(e.offset, e.size);
  if (!end) tensor_fail(e, i, "offset {} + size {} overflows uint64", e.offset, e.size);
  if (e.quantization) {
    const auto scale = static_cast<std::uint32_t>(e.quantization->scale_dtype);
    if (!known_dtype(scale)) tensor_fail(e, i, "unknown quantization scale dtype {}", scale);
  }
  if (e.sharding) {
    const Sharding& s = *e.sharding;
    if (s.index >= s.count) {
      tensor_fail(e, i, "sharding index {} >= count {}", s.index, s.count);
    }
    if (!e.shape.empty() && s.dim >= e.shape.size()) {
      tensor_fail(e, i, "sharding dim {} >= ndim {}", s.dim, e.shape.size());
    }
  }
  if (e.block) {
    const Block& b = *e.block;
    if (b.global_shape.size() != e.shape.size() || b.offsets.size() != e.shape.size()) {
      tensor_fail(e, i, "block of {} dims with {} offsets for an entry of {} dims",
                  b.global_shape.size(), b.offsets.size(), e.shape.size());
    }
    for (std::size_t d = 0; d < e.shape.size(); ++d) {
      const auto block_end = checked_add(b.offsets[d], e.shape[d]);
      if (!block_end || *block_end > b.global_shape[d]) {
        tensor_fail(e, i, "block [{}, +{}) on dim {} lies outside the global shape {}",
                    b.offsets[d], e.shape[d], d, shape_string(b.global_shape));
      }
    }
    if (!byte_size(e.dtype, b.global_shape)) {
      tensor_fail(e, i, "global shape {} overflows uint64", shape_string(b.global_shape));
    }
  }
  return *end;
}

// FNV-1a, 64 bit. Chosen over xxhash so the SDK needs no hashing library; a signature hashes a
// few hundred bytes per tensor once per manifest, so speed does not matter here.
class Fnv1a {
 public:
  void bytes(const void* data, std::size_t size) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
      state_ ^= p[i];
      state_ *= 0x100000001b3ull;
    }
  }
  // Little-endian regardless of host, so signatures are stable across machines.
  void u64(std::uint64_t v) noexcept {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, sizeof b);
  }
  std::uint64_t value() const noexcept { return state_; }

 private:
  std::uint64_t state_ = 0xcbf29ce484222325ull;
};

// Reads the capnp message into plain values, checking every list length against `limits` before
// anything is copied. Throws kj::Exception for malformed messages (the caller converts).
Manifest read_message(schema::Manifest::Reader root, const Limits& limits) {
  Manifest out;
  out.version = root.getVersion();
  out.bucket_index = root.getBucketIndex();
  out.bucket_count = root.getBucketCount();
  out.bucket_bytes = root.getBucketBytes();
  const auto label = root.getVersionLabel();
  if (label.size() > limits.max_name_bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: version label of {} bytes exceeds the limit of {}",
         label.size(), limits.max_name_bytes);
  }
  out.version_label.assign(label.cStr(), label.size());

  const auto tensors = root.getTensors();
  if (tensors.size() > limits.max_tensors) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: {} tensors exceed the limit of {}", tensors.size(),
         limits.max_tensors);
  }
  out.tensors.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto t = tensors[static_cast<unsigned>(i)];
    Entry e;
    const auto name = t.getName();
    if (name.size() > limits.max_name_bytes) {
      // Name only the first bytes: the whole point is that this name is too long to print.
      e.name.assign(name.cStr(), std::min<std::size_t>(name.size(), 80));
      tensor_fail(e, i, "name of {} bytes exceeds the limit of {}", name.size(),
                  limits.max_name_bytes);
    }
    e.name.assign(name.cStr(), name.size());
    const auto raw_dtype = static_cast<std::uint16_t>(t.getDtype());
    if (!known_dtype(raw_dtype)) tensor_fail(e, i, "unknown dtype ordinal {}", raw_dtype);
    e.dtype = static_cast<ferry_dtype_t>(raw_dtype);
    const auto shape = t.getShape();
    const std::size_t dim_limit = std::min<std::size_t>(limits.max_dims, FERRY_MAX_DIMS);
    if (shape.size() > dim_limit) {
      tensor_fail(e, i, "{} dims exceed the limit of {}", shape.size(), dim_limit);
    }
    e.shape.reserve(shape.size());
    for (std::uint64_t d : shape) e.shape.push_back(d);
    e.offset = t.getOffset();
    e.size = t.getSize();
    if (t.hasFingerprint()) {
      const auto fp = t.getFingerprint();
      const auto algorithm = fp.getAlgorithm();
      if (std::string_view(algorithm.cStr(), algorithm.size()) != kFingerprintAlgorithm) {
        tensor_fail(e, i, "fingerprint algorithm {} is not '{}'",
                    quoted(std::string_view(algorithm.cStr(), algorithm.size())),
                    kFingerprintAlgorithm);
      }
      e.fingerprint = fp.getValue();
    }
    if (t.hasQuantization()) {
      const auto q = t.getQuantization();
      Quantization quant;
      const auto scheme = q.getScheme();
      const auto format = q.getScaleFormat();
      if (scheme.size() > limits.max_name_bytes || format.size() > limits.max_name_bytes) {
        tensor_fail(e, i, "quantization scheme or scale format exceeds {} bytes",
                    limits.max_name_bytes);
      }
      quant.scheme.assign(scheme.cStr(), scheme.size());
      quant.block_rows = q.getBlockRows();
      quant.block_cols = q.getBlockCols();
      const auto raw_scale = static_cast<std::uint16_t>(q.getScaleDtype());
      if (!known_dtype(raw_scale)) {
        tensor_fail(e, i, "unknown quantization scale dtype ordinal {}", raw_scale);
      }
      quant.scale_dtype = static_cast<ferry_dtype_t>(raw_scale);
      quant.scale_format.assign(format.cStr(), format.size());
      e.quantization = std::move(quant);
    }
    if (t.hasSharding()) {
      const auto s = t.getSharding();
      e.sharding = Sharding{s.getDim(), s.getIndex(), s.getCount()};
    }
    if (t.hasBlock()) {
      const auto b = t.getBlock();
      if (b.getGlobalShape().size() > limits.max_dims || b.getOffsets().size() > limits.max_dims) {
        tensor_fail(e, i, "block of more than {} dims", limits.max_dims);
      }
      Block block;
      for (auto v : b.getGlobalShape()) block.global_shape.push_back(v);
      for (auto v : b.getOffsets()) block.offsets.push_back(v);
      e.block = std::move(block);
    }
    out.tensors.push_back(std::move(e));
  }
  return out;
}

}  // namespace

void validate(const Manifest& m, const Limits& limits) {
  if (m.tensors.size() > limits.max_tensors) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: {} tensors exceed the limit of {}",
         m.tensors.size(), limits.max_tensors);
  }
  const bool bucket = m.bucket_count > 0;
  if (bucket && m.bucket_index >= m.bucket_count) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: bucket_index {} >= bucket_count {}",
         m.bucket_index, m.bucket_count);
  }
  std::unordered_map<std::string_view, std::size_t> seen;
  seen.reserve(m.tensors.size());
  std::uint64_t prev_end = 0;
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Entry& e = m.tensors[i];
    const std::uint64_t end = validate_entry(e, i, limits);
    const auto [it, inserted] = seen.emplace(e.name, i);
    if (!inserted) tensor_fail(e, i, "duplicate name (first at index {})", it->second);
    if (!bucket) continue;
    if (i > 0) {
      const Entry& prev = m.tensors[i - 1];
      if (e.offset < prev.offset) {
        tensor_fail(e, i, "offset {} is before {} at {} (entries must be sorted by offset)",
                    e.offset, quoted(prev.name), prev.offset);
      }
      if (e.offset < prev_end) {
        tensor_fail(e, i, "byte range [{}, {}) overlaps {} [{}, {})", e.offset, end,
                    quoted(prev.name), prev.offset, prev_end);
      }
    }
    if (e.offset - prev_end > limits.max_bucket_gap) {
      tensor_fail(e, i, "gap of {} bytes before {} exceeds {}", e.offset - prev_end,
                  quoted(e.name), limits.max_bucket_gap);
    }
    if (end > m.bucket_bytes) {
      tensor_fail(e, i, "ends at {} past bucket of {} bytes", end, m.bucket_bytes);
    }
    prev_end = end;
  }
}

std::vector<std::uint8_t> encode(const Manifest& m) {
  validate(m);
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Manifest>();
  root.setVersion(m.version);
  root.setVersionLabel(m.version_label);
  root.setBucketIndex(m.bucket_index);
  root.setBucketCount(m.bucket_count);
  root.setBucketBytes(m.bucket_bytes);
  auto tensors = root.initTensors(static_cast<unsigned>(m.tensors.size()));
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Entry& e = m.tensors[i];
    auto t = tensors[static_cast<unsigned>(i)];
    t.setName(capnp::Text::Reader(e.name.data(), e.name.size()));
    t.setDtype(static_cast<schema::DType>(e.dtype));
    auto shape = t.initShape(static_cast<unsigned>(e.shape.size()));
    for (std::size_t d = 0; d < e.shape.size(); ++d) shape.set(static_cast<unsigned>(d), e.shape[d]);
    t.setOffset(e.offset);
    t.setSize(e.size);
    if (e.fingerprint) {
      auto fp = t.initFingerprint();
      fp.setAlgorithm(kFingerprintAlgorithm);
      fp.setValue(*e.fingerprint);
    }
    if (e.quantization) {
      const Quantization& q = *e.quantization;
      auto out = t.initQuantization();
      out.setScheme(capnp::Text::Reader(q.scheme.data(), q.scheme.size()));
      out.setBlockRows(q.block_rows);
      out.setBlockCols(q.block_cols);
      out.setScaleDtype(static_cast<schema::DType>(q.scale_dtype));
      out.setScaleFormat(capnp::Text::Reader(q.scale_format.data(), q.scale_format.size()));
    }
    if (e.sharding) {
      auto out = t.initSharding();
      out.setDim(e.sharding->dim);
      out.setIndex(e.sharding->index);
      out.setCount(e.sharding->count);
    }
    if (e.block) {
      auto out = t.initBlock();
      auto global = out.initGlobalShape(static_cast<unsigned>(e.block->global_shape.size()));
      for (unsigned d = 0; d < e.block->global_shape.size(); ++d) {
        global.set(d, e.block->global_shape[d]);
      }
      auto offsets = out.initOffsets(static_cast<unsigned>(e.block->offsets.size()));
      for (unsigned d = 0; d < e.block->offsets.size(); ++d) offsets.set(d, e.block->offsets[d]);
    }
  }
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(message);
  const auto bytes = flat.asBytes();
  return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
}

Manifest decode(std::span<const std::uint8_t> bytes, const Limits& limits) {
  if (bytes.empty()) fail(FERRY_STATUS_CORRUPT_DATA, "manifest: empty input");
  if (bytes.size() > limits.max_message_bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: message of {} bytes exceeds the limit of {}",
         bytes.size(), limits.max_message_bytes);
  }
  if (bytes.size() % kWordBytes != 0) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "manifest: message of {} bytes is not a whole number of 8-byte words", bytes.size());
  }
  // Cap'n Proto reads words in place; bytes from a socket or a file offset may be misaligned.
  kj::Array<capnp::word> aligned;
  kj::ArrayPtr<const capnp::word> words;
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(capnp::word) == 0) {
    words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(bytes.data()),
                         bytes.size() / kWordBytes);
  } else {
    aligned = kj::heapArray<capnp::word>(bytes.size() / kWordBytes);
    std::memcpy(aligned.begin(), bytes.data(), bytes.size());
    words = kj::arrayPtr(aligned.begin(), aligned.size());
  }

  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  Manifest out;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "manifest: {} trailing bytes after the message",
           static_cast<std::size_t>(words.end() - reader.getEnd()) * kWordBytes);
    }
    out = read_message(reader.getRoot<schema::Manifest>(), limits);
  } catch (const kj::Exception& e) {
    fail(FERRY_STATUS_CORRUPT_DATA, "manifest: {}", e.getDescription().cStr());
  }
  validate(out, limits);
  return out;
}

std::uint64_t signature(const Manifest& m) {
  Fnv1a h;
  h.u64(m.tensors.size());
  for (const Entry& e : m.tensors) {
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    h.u64(e.name.size());
    h.bytes(e.name.data(), e.name.size());
    h.u64(static_cast<std::uint64_t>(e.dtype));
    h.u64(e.shape.size());
    for (std::uint64_t d : e.shape) h.u64(d);
    // A block plans differently from a whole tensor of its shape (a whole tensor's signature
    // is what it was before blocks existed).
    if (e.block) {
      h.u64(0xb10cull);
      for (std::uint64_t d : e.block->global_shape) h.u64(d);
      for (std::uint64_t d : e.block->offsets) h.u64(d);
    }
  }
  return h.value();
}

std::string catalog_key(std::span<const ferry_tensor_desc_t> descs) {
  std::string key;
  auto u64 = [&](std::uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    key.append(b, 8);
  };
  u64(descs.size());
  for (const auto& d : descs) {
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    const std::string_view name = d.name != nullptr ? std::string_view(d.name) : std::string_view();
    u64(name.size());
    key.append(name);
    u64(static_cast<std::uint64_t>(d.dtype));
    u64(d.ndim);
    const std::uint64_t dims = std::min<std::uint64_t>(d.ndim, FERRY_MAX_DIMS);
    for (std::uint64_t k = 0; k < dims; ++k) u64(d.shape[k]);
  }
  return key;
}

ferry_tensor_desc_t tensor_desc(const std::string& name, ferry_dtype_t dtype,
                                std::span<const std::uint64_t> shape) {
  if (shape.size() > FERRY_MAX_DIMS) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "tensor {}: {} dims exceed {}", quoted(name), shape.size(),
         FERRY_MAX_DIMS);
  }
  ferry_tensor_desc_t desc{};
  desc.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
  desc.name = name.c_str();
  desc.dtype = dtype;
  desc.ndim = static_cast<std::uint32_t>(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) desc.shape[d] = shape[d];
  return desc;
}

std::vector<ferry_tensor_desc_t> tensor_descs(const Manifest& m) {
  std::vector<ferry_tensor_desc_t> out;
  out.reserve(m.tensors.size());
  for (const Entry& e : m.tensors) out.push_back(tensor_desc(e.name, e.dtype, e.shape));
  return out;
}

}  // namespace ferry::manifest
