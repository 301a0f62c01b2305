// formats/src/torch_reductions.cpp: torch.multiprocessing's tensor reductions, decoded from the
// restricted reader's value tree (see torch_reductions.hpp).
#include <ferry/formats/torch_reductions.hpp>

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace ferry::torch_reductions {
namespace {

using ckpt_engine::describe;
using ckpt_engine::ValueKind;

constexpr std::string_view kReductions = "torch.multiprocessing.reductions.";
constexpr std::size_t kRebuildArgs = 15;
constexpr std::size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

template <typename... Args>
[[noreturn]] void bad(std::string_view owner, fmt::format_string<Args...> format, Args&&... args) {
  fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}", owner,
       fmt::format(format, std::forward<Args>(args)...));
}

std::uint64_t non_negative(const Value& v, std::string_view owner, std::string_view field) {
  if (!v.is(ValueKind::integer)) bad(owner, "{} must be an int, got {}", field, describe(v));
  if (v.integer < 0) bad(owner, "{} must not be negative, got {}", field, v.integer);
  return static_cast<std::uint64_t>(v.integer);
}

bool boolean(const Value& v, std::string_view owner, std::string_view field) {
  if (!v.is(ValueKind::boolean)) bad(owner, "{} must be a bool, got {}", field, describe(v));
  return v.boolean;
}

const std::string& bytes_of(const Value& v, std::string_view owner, std::string_view field) {
  if (!v.is(ValueKind::bytes)) bad(owner, "{} must be bytes, got {}", field, describe(v));
  return v.text;
}

bool is_call(const Value& v, std::string_view callee) {
  return v.is(ValueKind::call) && v.text == callee;
}

// The highest element index the tensor touches + 1 (0 for an empty tensor); nullopt on overflow.
std::optional<std::uint64_t> extent(const std::vector<std::uint64_t>& shape,
                                    const std::vector<std::uint64_t>& stride) {
  std::uint64_t last = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    const auto step = checked_mul(shape[d] - 1, stride[d]);
    if (!step) return std::nullopt;
    const auto sum = checked_add(last, *step);
    if (!sum) return std::nullopt;
    last = *sum;
  }
  return checked_add(last, 1);
}

// The tensor [offset, offset + extent) elements of `esize` bytes lies inside `storage_bytes`.
void check_inside(std::string_view owner, const std::vector<std::uint64_t>& shape,
                  const std::vector<std::uint64_t>& stride, std::uint64_t offset, std::size_t esize,
                  std::uint64_t storage_bytes) {
  if (shape.size() != stride.size()) {
    bad(owner, "size has {} dims but stride {}", shape.size(), stride.size());
  }
  const auto n = extent(shape, stride);
  const auto end = n ? checked_add(offset, *n) : std::nullopt;
  const auto end_bytes = end ? checked_mul(*end, esize) : std::nullopt;
  if (!end_bytes || (*n > 0 && *end_bytes > storage_bytes)) {
    bad(owner,
        "a tensor of size {} stride {} at element offset {} does not fit its storage of {} "
        "bytes",
        shape_string(shape), shape_string(stride), offset, storage_bytes);
  }
}

}  // namespace

ferry_dtype_t torch_dtype(const Value& v, std::string_view owner) {
  constexpr std::string_view kPrefix = "torch.";
  if (!v.is(ValueKind::global) || !v.text.starts_with(kPrefix)) {
    bad(owner, "dtype must be a torch dtype, got {}", describe(v));
  }
  const std::string_view name = std::string_view(v.text).substr(kPrefix.size());
  const auto dtype = dtype_from_name(name);
  // dtype_from_name also knows the safetensors spelling; only lower-case torch names count here.
  if (!dtype || name.empty() || !(name[0] >= 'a' && name[0] <= 'z')) {
    bad(owner, "dtype {} is not supported by ferry", v.text);
  }
  return *dtype;
}

std::vector<std::uint64_t> torch_dims(const Value& v, std::string_view field) {
  const Value* seq = &v;
  if (v.is(ValueKind::call)) {
    if (v.text != "torch.Size" || v.items.size() != 1) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{} must be torch.Size(tuple), got {}", field, describe(v));
    }
    seq = v.items[0].get();
  }
  if (!seq->is(ValueKind::tuple) && !seq->is(ValueKind::list)) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{} must be a torch.Size, tuple or list of ints, got {}", field,
         describe(*seq));
  }
  if (seq->items.size() > FERRY_MAX_DIMS) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{} has {} dims; at most {} are supported", field,
         seq->items.size(), FERRY_MAX_DIMS);
  }
  std::vector<std::uint64_t> out;
  out.reserve(seq->items.size());
  for (const auto& d : seq->items) {
    if (!d->is(ValueKind::integer)) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{} must be an int, got {}", field, describe(*d));
    }
    if (d->integer < 0) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{} must not be negative, got {}", field, d->integer);
    }
    out.push_back(static_cast<std::uint64_t>(d->integer));
  }
  return out;
}

bool is_cuda_rebuild(std::string_view callee) noexcept {
  return callee == "torch.multiprocessing.reductions.rebuild_cuda_tensor" ||
         callee == "sglang.srt.utils.patch_torch._rebuild_cuda_tensor_modified";
}

CudaIpcTensor decode_cuda_ipc_tensor(const Value& args, std::string_view owner) {
  if (args.items.size() != kRebuildArgs) {
    bad(owner, "rebuild_cuda_tensor takes {} arguments, got {}", kRebuildArgs, args.items.size());
  }
  const auto& a = args.items;
  CudaIpcTensor h;
  if (!a[0]->is(ValueKind::global) ||
      (a[0]->text != "torch.Tensor" && a[0]->text != "torch.nn.parameter.Parameter")) {
    bad(owner, "tensor class must be torch.Tensor, got {}", describe(*a[0]));
  }
  h.tensor_class = a[0]->text;
  h.size = torch_dims(*a[1], fmt::format("{}: tensor_size", owner));
  h.stride = torch_dims(*a[2], fmt::format("{}: tensor_stride", owner));
  h.tensor_offset = non_negative(*a[3], owner, "tensor_offset");
  if (!a[4]->is(ValueKind::global) || a[4]->text.find("Storage") == std::string::npos) {
    bad(owner, "storage class must be a torch storage class, got {}", describe(*a[4]));
  }
  h.storage_class = a[4]->text;
  h.dtype = torch_dtype(*a[5], owner);
  if (a[6]->is(ValueKind::integer)) {
    h.device = a[6]->integer;
  } else if (a[6]->is(ValueKind::str) && !a[6]->text.empty() && a[6]->text.size() <= 128) {
    h.device = -1;
    h.device_uuid = a[6]->text;
  } else {
    bad(owner, "device must be an int or a device UUID string, got {}", describe(*a[6]));
  }
  h.storage_handle = bytes_of(*a[7], owner, "storage_handle");
  h.storage_size_bytes = non_negative(*a[8], owner, "storage_size_bytes");
  h.storage_offset_bytes = non_negative(*a[9], owner, "storage_offset_bytes");
  h.requires_grad = boolean(*a[10], owner, "requires_grad");
  h.ref_counter_handle = bytes_of(*a[11], owner, "ref_counter_handle");
  h.ref_counter_offset = non_negative(*a[12], owner, "ref_counter_offset");
  if (!a[13]->is(ValueKind::none)) h.event_handle = bytes_of(*a[13], owner, "event_handle");
  h.event_sync_required = boolean(*a[14], owner, "event_sync_required");

  check_inside(owner, h.size, h.stride, h.tensor_offset, dtype_size(h.dtype), h.storage_size_bytes);
  if (h.storage_handle.empty() ||
      (h.event_handle.has_value() && h.event_handle->size() != kIpcHandleBytes)) {
    bad(owner, "storage handle of {} bytes / event handle of {} bytes is malformed",
        h.storage_handle.size(), h.event_handle ? h.event_handle->size() : 0);
  }
  const auto& s = h.storage_handle;
  if (s.size() == kIpcHandleBytes) {
    h.handle_format = CudaHandleFormat::legacy_ipc_mem_handle;
    std::copy(s.begin(), s.end(), h.ipc_mem_handle.begin());
  } else if (s.size() == kIpcHandleBytes + 2 && s[1] == 'c') {
    h.handle_format = CudaHandleFormat::cuda_malloc;
    h.handle_version = static_cast<std::uint8_t>(s[0]);
    std::copy(s.begin() + 2, s.end(), h.ipc_mem_handle.begin());
  } else if (s.size() > 2 && s[1] == 'e') {
    h.handle_format = CudaHandleFormat::expandable_segment;
    h.handle_version = static_cast<std::uint8_t>(s[0]);
  } else {
    bad(owner,
        "storage handle of {} bytes is neither a cudaIpcMemHandle_t nor a versioned torch "
        "handle ('c' or 'e')",
        s.size());
  }
  return h;
}

void release_cuda_ipc_reference(const std::string& file, std::uint64_t slot) noexcept {
  if (file.empty() || slot > (std::uint64_t{1} << 40)) return;
  const int fd = shm_open(file.c_str(), O_RDWR, 0);
  if (fd < 0) return;  // the producer removed it already: nothing is held
  struct stat st {};
  const std::uint64_t need = (slot + 1) * sizeof(std::int64_t);
  if (fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= need) {
    void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      __atomic_fetch_sub(static_cast<std::int64_t*>(p) + slot, 1, __ATOMIC_SEQ_CST);
      munmap(p, need);
    }
  }
  close(fd);
}

bool Tensor::contiguous() const noexcept {
  std::uint64_t expect = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

std::uint64_t Tensor::bytes() const noexcept {
  return byte_size(dtype, shape).value_or(0);
}

Tensor decode_tensor(const Value& v, std::string_view owner) {
  if (!v.is(ValueKind::call))
    bad(owner, "a tensor must be a torch rebuild call, got {}", describe(v));
  Tensor t;
  if (is_cuda_rebuild(v.text)) {
    auto cuda = decode_cuda_ipc_tensor(v, owner);
    t.dtype = cuda.dtype;
    t.shape = cuda.size;
    t.stride = cuda.stride;
    t.offset = cuda.tensor_offset;
    t.storage = std::move(cuda);
  } else if (v.text == std::string(kReductions) + "rebuild_tensor") {
    if (v.items.size() != 3) bad(owner, "rebuild_tensor takes 3 arguments, got {}", v.items.size());
    if (!v.items[0]->is(ValueKind::global) ||
        (v.items[0]->text != "torch.Tensor" &&
         v.items[0]->text != "torch.nn.parameter.Parameter")) {
      bad(owner, "tensor class must be torch.Tensor, got {}", describe(*v.items[0]));
    }
    const Value& typed = *v.items[1];
    const Value& meta = *v.items[2];
    if (!is_call(typed, std::string(kReductions) + "rebuild_typed_storage") ||
        typed.items.size() != 2) {
      bad(owner, "the storage must be rebuild_typed_storage(storage, dtype), got {}",
          describe(typed));
    }
    t.dtype = torch_dtype(*typed.items[1], owner);
    const Value& untyped = *typed.items[0];
    if (is_call(untyped, std::string(kReductions) + "rebuild_storage_fd")) {
      bad(owner,
          "a CPU tensor shared by file descriptor (torch's default sharing strategy on "
          "Linux) cannot be opened by another process: its descriptor is handed out by "
          "the sender's multiprocessing resource sharer to processes of its own family "
          "only. Call torch.multiprocessing.set_sharing_strategy('file_system') in the "
          "trainer, or send CUDA tensors");
    }
    if (!is_call(untyped, std::string(kReductions) + "rebuild_storage_filename") ||
        untyped.items.size() != 4) {
      bad(owner,
          "the untyped storage must be rebuild_storage_filename(cls, manager, name, size), "
          "got {}",
          describe(untyped));
    }
    SharedMemoryFile file;
    file.manager = bytes_of(*untyped.items[1], owner, "shared memory manager");
    file.name = bytes_of(*untyped.items[2], owner, "shared memory name");
    file.size_bytes = non_negative(*untyped.items[3], owner, "shared memory size");
    // A POSIX shared-memory name: one leading '/', no other slash, no NUL, not "." or "..".
    if (file.name.size() < 2 || file.name.size() > 255 || file.name[0] != '/' ||
        file.name.find('/', 1) != std::string::npos || file.name.find('\0') != std::string::npos ||
        file.name == "/." || file.name == "/..") {
      bad(owner, "shared memory name '{}' is not a POSIX shared-memory object name",
          file.name.substr(0, 64));
    }
    if (!meta.is(ValueKind::tuple) || meta.items.size() != 4) {
      bad(owner, "rebuild_tensor metadata must be (offset, size, stride, requires_grad), got {}",
          describe(meta));
    }
    t.offset = non_negative(*meta.items[0], owner, "storage_offset");
    t.shape = torch_dims(*meta.items[1], fmt::format("{}: size", owner));
    t.stride = torch_dims(*meta.items[2], fmt::format("{}: stride", owner));
    boolean(*meta.items[3], owner, "requires_grad");
    check_inside(owner, t.shape, t.stride, t.offset, dtype_size(t.dtype), file.size_bytes);
    t.storage = std::move(file);
  } else {
    bad(owner, "a tensor must be rebuilt by torch's rebuild_cuda_tensor or rebuild_tensor, got {}",
        describe(v));
  }
  if (t.shape.size() != t.stride.size()) {
    bad(owner, "size has {} dims but stride {}", t.shape.size(), t.stride.size());
  }
  if (!byte_size(t.dtype, t.shape))
    bad(owner, "byte size of shape {} overflows", shape_string(t.shape));
  return t;
}

}  // namespace ferry::torch_reductions
