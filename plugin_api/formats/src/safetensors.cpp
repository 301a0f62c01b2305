// Safetensors reading with strict validation, sharded checkpoints, and writing (see
// ferry/formats/safetensors.hpp; the rules are listed in plugins/disk/README.md).
#include <ferry/formats/safetensors.hpp>

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>
#include <utility>

namespace ferry::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string errno_text(int err) { return std::strerror(err); }

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points past
// U+10FFFF included), or nullopt when `text` is valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    std::uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::nullopt;
}

// Parses JSON text, refusing duplicate keys at any level (nlohmann keeps the last one silently)
// and nesting deeper than kMaxJsonDepth. `what` ("header", "index") and `top_key_noun` ("tensor
// name", "key") shape the messages.
json parse_strict_json(std::string_view label, std::string_view text, std::string_view what,
                       std::string_view top_key_noun) {
  if (auto bad = first_invalid_utf8(text)) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {} is not valid UTF-8 (bad byte at offset {})", label,
         what, *bad);
  }
  std::vector<std::set<std::string>> scopes;  // keys seen in each open object
  std::vector<std::string> scope_names;       // the key each open object is the value of
  std::string last_key;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    if (depth > kMaxJsonDepth) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {} nests deeper than {} levels", label, what,
           kMaxJsonDepth);
    }
    switch (event) {
      case json::parse_event_t::object_start:
        scope_names.push_back(scopes.empty() ? std::string() : last_key);
        scopes.emplace_back();
        break;
      case json::parse_event_t::object_end:
        scopes.pop_back();
        scope_names.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!scopes.back().insert(key).second) {
          if (scopes.size() == 1) {
            fail(FERRY_STATUS_CORRUPT_DATA, "{}: duplicate {} '{}' in the {}", label,
                 top_key_noun, key, what);
          }
          fail(FERRY_STATUS_CORRUPT_DATA, "{}: duplicate key '{}' inside '{}' in the {}", label,
               key, scope_names.back(), what);
        }
        last_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {} is not valid JSON: {}", label, what, e.what());
  }
}

void parse_metadata(std::string_view label, const json& value,
                    std::map<std::string, std::string>& out) {
  if (!value.is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: __metadata__ must be an object of string to string (it is {})", label,
         value.type_name());
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: __metadata__ must be an object of string to string (key '{}' is {})", label,
           key, item.type_name());
    }
    out.emplace(key, item.get<std::string>());
  }
}

std::uint64_t unsigned_field(std::string_view label, const std::string& name, const char* field,
                             const json& value) {
  if (!value.is_number_unsigned()) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': \"{}\" must hold non-negative integers (found {} {})", label, name,
         field, value.type_name(), value.dump());
  }
  return value.get<std::uint64_t>();
}

TensorInfo parse_entry(std::string_view label, const std::string& name, const json& entry) {
  if (name.empty()) fail(FERRY_STATUS_CORRUPT_DATA, "{}: a tensor has an empty name", label);
  if (name.find('\0') != std::string::npos) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor name '{}' contains a NUL character", label,
         name);
  }
  if (!entry.is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}': entry is not a JSON object (it is {})",
         label, name, entry.type_name());
  }
  auto field = [&](const char* key) -> const json& {
    auto it = entry.find(key);
    if (it == entry.end()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}': entry is missing \"{}\"", label, name,
           key);
    }
    return *it;
  };
  TensorInfo info;
  info.name = name;

  const json& dtype = field("dtype");
  if (!dtype.is_string()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}': \"dtype\" must be a string (it is {})",
         label, name, dtype.type_name());
  }
  const auto& dtype_text = dtype.get_ref<const std::string&>();
  auto parsed = dtype_from_name(dtype_text);
  // dtype_from_name also takes torch spellings; a safetensors header uses only the upper case.
  if (!parsed || dtype_text != dtype_name(*parsed)) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': unknown dtype '{}' (supported: F64, F32, F16, BF16, I64, I32, I16, "
         "I8, U8, BOOL, F8_E4M3, F8_E5M2)",
         label, name, dtype_text);
  }
  info.dtype = *parsed;

  const json& shape = field("shape");
  if (!shape.is_array()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}': \"shape\" must be an array (it is {})",
         label, name, shape.type_name());
  }
  if (shape.size() > FERRY_MAX_DIMS) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}': shape has {} dims, more than {}", label,
         name, shape.size(), FERRY_MAX_DIMS);
  }
  for (const json& dim : shape) info.shape.push_back(unsigned_field(label, name, "shape", dim));

  const json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': \"data_offsets\" must be an array [begin, end] (found {})", label,
         name, offsets.dump());
  }
  info.begin = unsigned_field(label, name, "data_offsets", offsets[0]);
  info.end = unsigned_field(label, name, "data_offsets", offsets[1]);
  if (info.begin > info.end) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': data_offsets [{}, {}] have begin greater than end", label, name,
         info.begin, info.end);
  }
  auto bytes = byte_size(info.dtype, info.shape);
  if (!bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': shape {} of {} overflows a 64-bit byte size", label, name,
         shape_string(info.shape), dtype_text);
  }
  if (*bytes != info.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: tensor '{}': data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes",
         label, name, info.begin, info.end, info.size(), shape_string(info.shape), dtype_text,
         *bytes);
  }
  return info;
}

// The spans, sorted by begin, must tile [0, data_bytes) exactly.
void check_layout(std::string_view label, std::vector<TensorInfo>& tensors,
                  std::uint64_t data_bytes) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t expected = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.begin < expected) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", label, t.name,
           t.begin, t.end, previous->name, previous->begin, previous->end);
    }
    if (t.begin > expected) {
      if (previous == nullptr) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: tensor '{}': data_offsets [{}, {}]: the first tensor must start at offset 0 "
             "(gap of {} bytes)",
             label, t.name, t.begin, t.end, t.begin);
      }
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: tensor '{}': data_offsets [{}, {}]: gap of {} bytes after tensor '{}' (tensors "
           "must be contiguous)",
           label, t.name, t.begin, t.end, t.begin - expected, previous->name);
    }
    if (t.end > data_bytes) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} "
           "bytes)",
           label, t.name, t.begin, t.end, data_bytes);
    }
    expected = t.end;
    previous = &t;
  }
  if (expected != data_bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: the tensors end at byte {} but the data section is {} bytes ({} trailing bytes "
         "belong to no tensor)",
         label, expected, data_bytes, data_bytes - expected);
  }
}

void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(FERRY_STATUS_IO, "{}: write failed: {}", path, errno_text(errno));
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Writes `parts` to "<path>.tmp" and renames it over `path`.
void write_file_atomically(const std::string& path,
                           std::span<const std::span<const std::uint8_t>> parts) {
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail(FERRY_STATUS_IO, "{}: cannot create: {}", tmp, errno_text(errno));
  try {
    for (auto part : parts) write_all(fd.get(), part.data(), part.size(), tmp);
    if (::close(fd.release()) != 0) {
      fail(FERRY_STATUS_IO, "{}: close failed: {}", tmp, errno_text(errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      fail(FERRY_STATUS_IO, "{}: cannot rename to {}: {}", tmp, path, errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

std::span<const std::uint8_t> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

// Opens `path` for reading when it is a regular file (symbolic links followed). O_NONBLOCK: the
// open of a FIFO returns at once instead of waiting for a writer, and is then refused like a
// device or socket (INVALID_ARGUMENT naming what it is); regular files ignore the flag. Sets
// `size` to the file's size.
Fd open_regular_file(const std::string& path, std::uint64_t& size) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) fail(FERRY_STATUS_NOT_FOUND, "{}: no such file", path);
    fail(FERRY_STATUS_IO, "{}: cannot open: {}", path, errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(FERRY_STATUS_IO, "{}: stat failed: {}", path, errno_text(errno));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISDIR(st.st_mode)  ? "a folder"
                                              : "not a regular file";
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: is {}, not a regular file", path, kind);
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// Reads a whole small file (an index) with an upper bound.
std::string read_small_file(const std::string& path, std::uint64_t limit) {
  std::uint64_t size = 0;
  Fd fd = open_regular_file(path, size);
  if (size > limit) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: file is {} bytes, more than the limit of {}", path, size,
         limit);
  }
  std::string text(size, '\0');
  read_at(fd.get(), {reinterpret_cast<std::uint8_t*>(text.data()), text.size()}, 0, path);
  return text;
}

// A shard name from an index must stay inside the checkpoint's directory.
void check_shard_name(const std::string& index, const std::string& tensor,
                      const std::string& shard) {
  const fs::path p(shard);
  bool escapes = shard.empty() || p.is_absolute();
  for (const auto& part : p) escapes = escapes || part == "..";
  if (escapes) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: weight_map entry '{}' names shard '{}', which is not a relative path inside the "
         "checkpoint directory",
         index, tensor, shard);
  }
}

void read_indexed(Checkpoint& checkpoint, const fs::path& index_path, bool keep_open) {
  const std::string index = index_path.string();
  checkpoint.index_path = index;
  const json doc = parse_strict_json(index, read_small_file(index, kMaxHeaderBytes), "index",
                                     "key");
  if (!doc.is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: index is not a JSON object (it is {})", index,
         doc.type_name());
  }
  auto wm = doc.find("weight_map");
  if (wm == doc.end() || !wm->is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: index has no \"weight_map\" object", index);
  }
  if (wm->empty()) fail(FERRY_STATUS_CORRUPT_DATA, "{}: index \"weight_map\" is empty", index);

  std::map<std::string, std::string> weight_map;            // tensor -> shard
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: weight_map entry '{}' must be a shard file name string (it is {})", index,
           tensor, shard.type_name());
    }
    const auto& name = shard.get_ref<const std::string&>();
    check_shard_name(index, tensor, name);
    weight_map.emplace(tensor, name);
    by_shard[name].push_back(tensor);
  }

  const fs::path dir = index_path.parent_path();
  for (const auto& [shard, tensors] : by_shard) {
    const fs::path shard_path = dir / shard;
    std::error_code ec;
    if (!fs::exists(shard_path, ec)) {
      fail(FERRY_STATUS_NOT_FOUND, "{}: shard '{}' (listed for tensor '{}') does not exist",
           index, shard, tensors.front());
    }
    File file = read_file(shard_path.string(), keep_open);
    std::set<std::string> present;
    for (const TensorInfo& t : file.tensors) {
      present.insert(t.name);
      auto it = weight_map.find(t.name);
      if (it == weight_map.end()) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: tensor '{}' is in this shard but not in the index {}",
             file.path, t.name, index);
      }
      if (it->second != shard) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: tensor '{}' is in this shard but the index {} places it in shard '{}'",
             file.path, t.name, index, it->second);
      }
    }
    for (const std::string& tensor : tensors) {
      if (!present.contains(tensor)) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: tensor '{}' is listed in shard '{}' but that shard does not contain it", index,
             tensor, shard);
      }
    }
    checkpoint.files.push_back(std::move(file));
  }
}

void read_unindexed_directory(Checkpoint& checkpoint, const fs::path& dir, bool keep_open) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code type_ec;
    // Not only regular files: a FIFO or device named *.safetensors is refused by read_file
    // (never skipped, which would load the folder without it).
    if (p.extension() == ".safetensors" && !fs::is_directory(p, type_ec)) {
      paths.push_back(p.string());
    }
  }
  if (ec) fail(FERRY_STATUS_IO, "{}: cannot list directory: {}", dir.string(), ec.message());
  if (paths.empty()) {
    fail(FERRY_STATUS_NOT_FOUND, "{}: directory has no .safetensors files and no {}",
         dir.string(), kIndexFileName);
  }
  std::sort(paths.begin(), paths.end());
  std::map<std::string, std::string> owner;  // tensor -> file
  for (const std::string& path : paths) {
    File file = read_file(path, keep_open);
    for (const TensorInfo& t : file.tensors) {
      auto [it, inserted] = owner.emplace(t.name, path);
      if (!inserted) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: tensor '{}' is also in {} (without an index, tensor names must be unique "
             "across the directory's files)",
             path, t.name, it->second);
      }
    }
    checkpoint.files.push_back(std::move(file));
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() noexcept { return std::exchange(fd_, -1); }

void read_at(int fd, std::span<std::uint8_t> dst, std::uint64_t offset, std::string_view path) {
  std::size_t done = 0;
  while (done < dst.size()) {
    const ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(FERRY_STATUS_IO, "{}: read of {} bytes at offset {} failed: {}", path,
           dst.size() - done, offset + done, errno_text(errno));
    }
    if (n == 0) {
      // The file no longer holds what its header describes: corrupt data, not a failing disk.
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: short read: the file ends at offset {} but {} bytes were expected from offset {} "
           "(was it truncated?)",
           path, offset + done, dst.size(), offset);
    }
    done += static_cast<std::size_t>(n);
  }
}

File parse_header(std::string_view label, std::string_view header, std::uint64_t data_bytes) {
  const json doc = parse_strict_json(label, header, "header", "tensor name");
  if (!doc.is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: header is not a JSON object (it is {})", label,
         doc.type_name());
  }
  File file;
  file.path = std::string(label);
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      parse_metadata(label, value, file.metadata);
    } else {
      file.tensors.push_back(parse_entry(label, key, value));
    }
  }
  check_layout(label, file.tensors, data_bytes);
  return file;
}

File read_file(const std::string& path, bool keep_open) {
  std::uint64_t size = 0;
  Fd fd = open_regular_file(path, size);
  if (size < 8) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: file is {} bytes, shorter than the 8-byte header length prefix", path, size);
  }
  std::uint8_t prefix[8];
  read_at(fd.get(), prefix, 0, path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  // A safetensors file starts with the 8-byte little-endian length of its JSON header; a text
  // file (a config.json, an index) starts with text, which reads as an absurd length.
  const bool text = std::all_of(std::begin(prefix), std::end(prefix), [](std::uint8_t c) {
    return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t';
  });
  if (text && n > size) {
    std::string start(reinterpret_cast<const char*>(prefix), sizeof prefix);
    for (auto& c : start) {
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    }
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: not a safetensors file: it starts with text (\"{}\"), where a safetensors file "
         "starts with the 8-byte length of its header",
         path, start);
  }
  if (n > kMaxHeaderBytes) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: header length {} exceeds the limit of {} bytes", path,
         n, kMaxHeaderBytes);
  }
  if (8 + n > size) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: header length {} runs past the end of the file ({} bytes; truncated?)", path, n,
         size);
  }
  std::string header(n, '\0');
  read_at(fd.get(), {reinterpret_cast<std::uint8_t*>(header.data()), header.size()}, 8, path);
  File file = parse_header(path, header, size - 8 - n);
  file.file_size = size;
  file.header_bytes = n;
  if (keep_open) file.fd = std::move(fd);
  return file;
}

std::size_t Checkpoint::tensor_count() const noexcept {
  std::size_t n = 0;
  for (const File& f : files) n += f.tensors.size();
  return n;
}

std::uint64_t Checkpoint::total_bytes() const noexcept {
  std::uint64_t n = 0;
  // Each file's tensors tile its data section, so this cannot overflow a file size sum.
  for (const File& f : files) n += f.data_bytes();
  return n;
}

Checkpoint read_checkpoint(const std::string& path, bool keep_open) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    fail(FERRY_STATUS_IO, "{}: cannot stat: {}", path, ec.message());
  }
  if (!fs::exists(status)) fail(FERRY_STATUS_NOT_FOUND, "{}: no such file or directory", path);
  Checkpoint checkpoint;
  checkpoint.path = path;
  if (fs::is_directory(status)) {
    const fs::path index = fs::path(path) / kIndexFileName;
    if (fs::exists(index, ec)) {
      read_indexed(checkpoint, index, keep_open);
    } else {
      read_unindexed_directory(checkpoint, path, keep_open);
    }
  } else if (ends_with(path, ".index.json")) {
    read_indexed(checkpoint, path, keep_open);
  } else {
    checkpoint.files.push_back(read_file(path, keep_open));
  }
  return checkpoint;
}

void write_safetensors(const std::string& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const TensorData& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: tensor name '{}' is empty, reserved or used twice", path, t.name);
    }
    if (t.shape.size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tensor '{}': shape has more than {} dims", path,
           t.name, FERRY_MAX_DIMS);
    }
    auto bytes = byte_size(t.dtype, t.shape);
    if (!bytes || *bytes != t.bytes.size()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: tensor '{}': {} bytes given but shape {} of {} needs {}", path, t.name,
           t.bytes.size(), shape_string(t.shape), dtype_name(t.dtype),
           bytes ? std::to_string(*bytes) : std::string("an overflowing size"));
    }
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = std::vector<std::uint64_t>{offset, offset + *bytes};
    header[t.name] = std::move(entry);
    offset += *bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: cannot encode the header: {}", path, e.what());
  }
  // Padding keeps the data section 8-byte aligned, as other writers do.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  std::vector<std::span<const std::uint8_t>> parts;
  parts.emplace_back(prefix, 8);
  parts.push_back(as_bytes(text));
  for (const TensorData& t : tensors) parts.push_back(t.bytes);
  write_file_atomically(path, parts);
}

void write_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                 std::uint64_t total_bytes) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  doc["metadata"]["total_size"] = total_bytes;
  doc["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [tensor, shard] : weight_map) doc["weight_map"][tensor] = shard;
  std::string text;
  try {
    text = doc.dump(2);
  } catch (const nlohmann::json::exception& e) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: cannot encode the index: {}", path, e.what());
  }
  text.push_back('\n');
  const std::span<const std::uint8_t> parts[] = {as_bytes(text)};
  write_file_atomically(path, parts);
}

}  // namespace ferry::safetensors
