// capi/tensor_input.cpp: checks and reads ferry_tensor_t (DLPack or plain view) for the C API.
#include "capi/tensor_input.hpp"

#include <ferry/sdk/dtype.hpp>

#include <optional>
#include <string_view>
#include <unordered_set>

#include "capi/capi_boundary.hpp"

namespace ferry::capi {
namespace {

std::string dims_string(const std::int64_t* dims, std::uint32_t ndim) {
  std::string text = "[";
  for (std::uint32_t i = 0; i < ndim; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

// Which tensor a message is about, formatted only for a message: a push of thousands of tensors
// formats no string per tensor (it formatted three each before).
struct Where {
  const char* function;
  std::size_t index;
  const char* name;  // NULL before the name is checked
  std::string text() const {
    return name == nullptr ? fmt::format("{}: tensor {}", function, index)
                           : fmt::format("{}: tensor {} '{}'", function, index, name);
  }
};

// The raw description of a tensor, wherever it came from, before the checks.
struct RawTensor {
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::optional<DLDataType> dlpack_dtype;  // how a DLPack caller spelled the dtype, for messages
  std::uint32_t ndim = 0;
  const std::int64_t* shape = nullptr;
  const std::int64_t* strides = nullptr;
  void* data = nullptr;
  ferry_memory_kind_t memory_kind = FERRY_MEMORY_HOST;
  int device = 0;
};

// How the caller spelled the dtype.
std::string dtype_text(const RawTensor& raw) {
  if (raw.dlpack_dtype) {
    return fmt::format("DLPack (code {}, bits {}, lanes {})", raw.dlpack_dtype->code,
                       raw.dlpack_dtype->bits, raw.dlpack_dtype->lanes);
  }
  return fmt::format("dtype value {}", static_cast<int>(raw.dtype));
}

RawTensor from_dlpack(const DLTensor& dl, const Where& where) {
  RawTensor raw;
  raw.dtype = dtype_from_dlpack(dl.dtype);
  raw.dlpack_dtype = dl.dtype;
  if (dl.ndim < 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: ndim {} is negative", where.text(), dl.ndim);
  }
  raw.ndim = static_cast<std::uint32_t>(dl.ndim);
  raw.shape = dl.shape;
  raw.strides = dl.strides;
  raw.data = dl.data == nullptr ? nullptr : static_cast<char*>(dl.data) + dl.byte_offset;
  switch (dl.device.device_type) {
    case kDLCPU: raw.memory_kind = FERRY_MEMORY_HOST; break;
    case kDLCUDAHost: raw.memory_kind = FERRY_MEMORY_PINNED; break;
    case kDLCUDA:
    case kDLCUDAManaged: raw.memory_kind = FERRY_MEMORY_CUDA; break;
    default:
      fail(
          FERRY_STATUS_INVALID_ARGUMENT,
          "{}: DLPack device type {} is not supported (ferry reads CPU, CUDA host and CUDA memory)",
          where.text(), static_cast<int>(dl.device.device_type));
  }
  raw.device = dl.device.device_id;
  return raw;
}

RawTensor from_view(const ferry_tensor_t& view, const Where& where) {
  RawTensor raw;
  raw.dtype = view.dtype;
  raw.ndim = view.ndim;
  raw.shape = view.shape;
  raw.strides = view.strides;
  raw.data = view.data;
  switch (view.memory_kind) {
    case FERRY_MEMORY_HOST:
    case FERRY_MEMORY_PINNED:
    case FERRY_MEMORY_CUDA: raw.memory_kind = view.memory_kind; break;
    default:
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: memory_kind {} is not one of FERRY_MEMORY_HOST, _PINNED, _CUDA", where.text(),
           static_cast<int>(view.memory_kind));
  }
  raw.device = view.device;
  return raw;
}

}  // namespace

ferry_dtype_t dtype_from_dlpack(DLDataType dtype) noexcept {
  if (dtype.lanes != 1) return FERRY_DTYPE_INVALID;
  switch (dtype.code) {
    case kDLFloat:
      return dtype.bits == 64 ? FERRY_DTYPE_F64
             : dtype.bits == 32 ? FERRY_DTYPE_F32
             : dtype.bits == 16 ? FERRY_DTYPE_F16
                                : FERRY_DTYPE_INVALID;
    case kDLBfloat: return dtype.bits == 16 ? FERRY_DTYPE_BF16 : FERRY_DTYPE_INVALID;
    case kDLInt:
      return dtype.bits == 64 ? FERRY_DTYPE_I64
             : dtype.bits == 32 ? FERRY_DTYPE_I32
             : dtype.bits == 16 ? FERRY_DTYPE_I16
             : dtype.bits == 8  ? FERRY_DTYPE_I8
                                : FERRY_DTYPE_INVALID;
    case kDLUInt: return dtype.bits == 8 ? FERRY_DTYPE_U8 : FERRY_DTYPE_INVALID;
    case kDLBool: return dtype.bits == 8 ? FERRY_DTYPE_BOOL : FERRY_DTYPE_INVALID;
    case kDLFloat8_e4m3fn: return dtype.bits == 8 ? FERRY_DTYPE_F8_E4M3 : FERRY_DTYPE_INVALID;
    case kDLFloat8_e5m2: return dtype.bits == 8 ? FERRY_DTYPE_F8_E5M2 : FERRY_DTYPE_INVALID;
    default: return FERRY_DTYPE_INVALID;
  }
}

TensorInput read_tensor(const ferry_tensor_t* tensor, std::size_t index, const char* function) {
  Where where{function, index, nullptr};
  if (tensor == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "{} is NULL", where.text());
  const ferry_tensor_t t =
      read_struct(tensor, FERRY_STRUCT_SIZE(ferry_tensor_t, dlpack), function, "tensor");
  if (t.name == nullptr || t.name[0] == '\0') {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} has no name (name is NULL or empty)", where.text());
  }
  where.name = t.name;
  const RawTensor raw = t.dlpack != nullptr ? from_dlpack(*t.dlpack, where) : from_view(t, where);

  if (raw.dtype == FERRY_DTYPE_INVALID || dtype_size(raw.dtype) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: {} is not a dtype ferry supports (f64, f32, f16, bf16, i64, i32, i16, i8, u8, bool, "
         "f8_e4m3, f8_e5m2)",
         where.text(), dtype_text(raw));
  }
  if (raw.ndim > FERRY_MAX_DIMS) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} dimensions, at most {} are supported", where.text(),
         raw.ndim, FERRY_MAX_DIMS);
  }
  if (raw.ndim > 0 && raw.shape == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: shape is NULL with ndim {}", where.text(), raw.ndim);
  }
  TensorInput out;
  out.name = t.name;
  out.dtype = raw.dtype;
  out.memory_kind = raw.memory_kind;
  out.device = raw.device;
  out.data = raw.data;
  for (std::uint32_t i = 0; i < raw.ndim; ++i) {
    if (raw.shape[i] < 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: shape {} has a negative extent", where.text(),
           dims_string(raw.shape, raw.ndim));
    }
    out.shape.push_back(static_cast<std::uint64_t>(raw.shape[i]));
  }
  const auto bytes = byte_size(out.dtype, out.shape);
  if (!bytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: shape {} overflows 64-bit byte counts", where.text(),
         dims_string(raw.shape, raw.ndim));
  }
  if (raw.strides != nullptr && *bytes > 0) {
    // Row-major: the last dimension has stride 1, each earlier one the product of those after
    // it. Extent-1 dimensions are never stepped over, so their stride does not matter.
    std::uint64_t expected = 1;  // cannot overflow: the element count fits (checked above)
    for (std::uint32_t k = raw.ndim; k-- > 0;) {
      if (raw.shape[k] != 1 && static_cast<std::uint64_t>(raw.strides[k]) != expected) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "{}: strides {} (elements) are not row-major contiguous for shape {}; pass a "
             "contiguous tensor (e.g. .contiguous())",
             where.text(), dims_string(raw.strides, raw.ndim), dims_string(raw.shape, raw.ndim));
      }
      expected *= static_cast<std::uint64_t>(raw.shape[k]);
    }
  }
  if (out.data == nullptr && *bytes > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: data is NULL for {} bytes", where.text(), *bytes);
  }
  return out;
}

std::vector<TensorInput> read_tensors(const ferry_tensor_t* const* tensors, std::size_t count,
                                      const char* function) {
  if (count > 0 && tensors == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tensors is NULL with {} tensors", function, count);
  }
  std::vector<TensorInput> out;
  out.reserve(count);  // never reallocated: `seen` views the names in place
  std::unordered_set<std::string_view> seen;
  seen.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back(read_tensor(tensors[i], i, function));
    if (!seen.insert(out.back().name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tensor {} '{}': the name appears twice", function,
           i, out.back().name);
    }
  }
  return out;
}

}  // namespace ferry::capi
