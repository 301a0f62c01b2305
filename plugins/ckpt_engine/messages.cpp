// ckpt_engine/messages.cpp: decoding of checkpoint-engine's pickled messages (value tree ->
// IpcBufferHandle / BucketMeta / EndSignal / AbortRequest) with every field validated.
#include "ckpt_engine/messages.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <numeric>
#include <string_view>
#include <unordered_set>

namespace ferry::ckpt_engine {
namespace {

constexpr std::string_view kRebuild = "torch.multiprocessing.reductions.rebuild_cuda_tensor";
constexpr std::size_t kMaxNameBytes = 4096;

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) {
  fail(FERRY_STATUS_CORRUPT_DATA, "checkpoint-engine message refused: {}",
       fmt::format(format, std::forward<Args>(args)...));
}

std::uint64_t non_negative(const Value& v, std::string_view field) {
  if (!v.is(ValueKind::integer)) bad("{} must be an int, got {}", field, describe(v));
  if (v.integer < 0) bad("{} must not be negative, got {}", field, v.integer);
  return static_cast<std::uint64_t>(v.integer);
}

// torch.Size(tuple) as pickled (REDUCE of torch.Size), or a plain tuple/list of ints (the worker
// accepts those too).
std::vector<std::uint64_t> dims(const Value& v, std::string_view field) {
  try {
    return torch_reductions::torch_dims(v, field);
  } catch (const Error& e) {
    bad("{}", e.what());
  }
}

// "torch.bfloat16" -> FERRY_DTYPE_BF16. `owner` names the tensor in messages.
ferry_dtype_t torch_dtype(const Value& v, std::string_view owner) {
  try {
    return torch_reductions::torch_dtype(v, owner);
  } catch (const Error& e) {
    bad("{}", e.what());
  }
}

IpcBufferHandle ipc_handle_from_args(const Value& args) {
  // The shared buffer is torch.empty(2 * bucket_size, dtype=torch.uint8): a flat byte tensor.
  if (args.items.size() > 5 && args.items[5]->is(ValueKind::global) &&
      args.items[5]->text != "torch.uint8") {
    bad("IPC handle: the buffer must be torch.uint8, got {}", args.items[5]->text);
  }
  IpcBufferHandle h;
  try {
    static_cast<torch_reductions::CudaIpcTensor&>(h) =
        torch_reductions::decode_cuda_ipc_tensor(args, "IPC handle");
  } catch (const Error& e) {
    bad("{}", e.what());
  }
  if (!h.device_uuid.empty()) bad("IPC handle: device must be an int, got '{}'", h.device_uuid);
  if (h.dtype != FERRY_DTYPE_U8) {
    bad("IPC handle: the buffer must be torch.uint8, got {}", args.items[5]->text);
  }
  if (h.size.size() != 1 || h.stride != std::vector<std::uint64_t>{1}) {
    bad("IPC handle: the buffer must be 1-D and contiguous, got size {} stride {}",
        shape_string(h.size), shape_string(h.stride));
  }
  return h;
}

BucketTensor bucket_tensor(const Value& item, std::size_t index) {
  if (!item.is(ValueKind::dict)) bad("bucket entry {} must be a dict, got {}", index, describe(item));
  if (item.dict_size() != 4) {
    bad("bucket entry {} must have the 4 keys name, dtype, shape, offset; it has {}", index,
        item.dict_size());
  }
  const Value* name = item.dict_get("name");
  const Value* dtype = item.dict_get("dtype");
  const Value* shape = item.dict_get("shape");
  const Value* offset = item.dict_get("offset");
  if (!name || !dtype || !shape || !offset) {
    bad("bucket entry {} must have the keys name, dtype, shape, offset (a key is missing or "
        "repeated)", index);
  }
  if (!name->is(ValueKind::str) || name->text.empty() || name->text.size() > kMaxNameBytes) {
    bad("bucket entry {}: name must be a non-empty str of at most {} bytes, got {}", index,
        kMaxNameBytes, describe(*name));
  }
  BucketTensor t;
  t.name = name->text;
  const std::string owner = fmt::format("tensor '{}'", t.name);
  t.dtype = torch_dtype(*dtype, owner);
  t.shape = dims(*shape, owner + " shape");
  t.offset = non_negative(*offset, owner + " offset");
  const auto size = byte_size(t.dtype, t.shape);
  if (!size) bad("{}: byte size of shape {} overflows", owner, shape_string(t.shape));
  t.bytes = *size;
  if (!checked_add(t.offset, t.bytes)) bad("{}: offset {} + {} bytes overflows", owner, t.offset, t.bytes);
  return t;
}

}  // namespace

IpcBufferHandle decode_ipc_handle(const Value& root) {
  if (!root.is(ValueKind::tuple) || root.items.size() != 2) {
    bad("IPC handle must be a tuple (rebuild function, arguments), got {}", describe(root));
  }
  const Value& fn = *root.items[0];
  const Value& args = *root.items[1];
  if (!fn.is(ValueKind::global) || fn.text != kRebuild) {
    bad("IPC handle must name {}, got {}", kRebuild, describe(fn));
  }
  if (!args.is(ValueKind::tuple)) bad("IPC handle arguments must be a tuple, got {}", describe(args));
  return ipc_handle_from_args(args);
}

BucketMeta decode_bucket(const Value& root) {
  if (!root.is(ValueKind::list)) bad("bucket must be a list, got {}", describe(root));
  BucketMeta bucket;
  bucket.tensors.reserve(root.items.size());
  std::unordered_set<std::string_view> names;
  for (std::size_t i = 0; i < root.items.size(); ++i) {
    bucket.tensors.push_back(bucket_tensor(*root.items[i], i));
  }
  for (const auto& t : bucket.tensors) {
    if (!names.insert(t.name).second) bad("tensor '{}' appears twice in one bucket", t.name);
  }
  if (!bucket.tensors.empty()) {
    bucket.begin = bucket.tensors[0].offset;
    for (const auto& t : bucket.tensors) {
      bucket.begin = std::min(bucket.begin, t.offset);
      bucket.end = std::max(bucket.end, t.offset + t.bytes);
    }
  }
  return bucket;
}

Message decode_message(const Value& root) {
  switch (root.kind) {
    case ValueKind::none:
      return EndSignal{};
    case ValueKind::list:
      return decode_bucket(root);
    case ValueKind::tuple:
      return decode_ipc_handle(root);
    case ValueKind::call: {
      // Only the allow-listed exception classes can be called with a state; torch.Size alone is
      // not a message.
      constexpr std::string_view kBuiltins = "builtins.";
      constexpr std::string_view kBuiltin2 = "__builtin__.";
      std::string_view callee = root.text;
      if (callee.starts_with(kBuiltins)) {
        callee.remove_prefix(kBuiltins.size());
      } else if (callee.starts_with(kBuiltin2)) {
        callee.remove_prefix(kBuiltin2.size());
      } else {
        bad("a message cannot be a call of {}", root.text);
      }
      AbortRequest abort{std::string(callee), {}};
      if (!root.items.empty() && root.items[0]->is(ValueKind::str)) abort.text = root.items[0]->text;
      return abort;
    }
    default:
      bad("a message must be the IPC handle tuple, a bucket list, None or an exception; got {}",
          describe(root));
  }
}

Message decode_message(std::span<const std::uint8_t> bytes, const PickleLimits& limits) {
  const ValuePtr root = read_pickle(bytes, limits);
  return decode_message(*root);
}

void check_bucket_in_buffer(const BucketMeta& bucket, std::uint64_t buffer_bytes) {
  std::vector<std::size_t> order(bucket.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (const auto& t : bucket.tensors) {
    if (t.offset > buffer_bytes || t.bytes > buffer_bytes - t.offset) {
      bad("tensor '{}' ({} bytes at offset {}) lies outside the shared buffer of {} bytes", t.name,
          t.bytes, t.offset, buffer_bytes);
    }
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return bucket.tensors[a].offset < bucket.tensors[b].offset;
  });
  // Sweep in offset order keeping the furthest end seen so far; empty tensors occupy nothing.
  const BucketTensor* furthest = nullptr;
  for (const std::size_t i : order) {
    const auto& cur = bucket.tensors[i];
    if (cur.bytes == 0) continue;
    if (furthest != nullptr && cur.offset < furthest->offset + furthest->bytes) {
      bad("tensors '{}' and '{}' overlap in the shared buffer", furthest->name, cur.name);
    }
    if (furthest == nullptr || cur.offset + cur.bytes > furthest->offset + furthest->bytes) furthest = &cur;
  }
}

}  // namespace ferry::ckpt_engine
