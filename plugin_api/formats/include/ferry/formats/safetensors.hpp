// ferry/formats/safetensors.hpp: reading and strictly validating safetensors checkpoints (one file, or a
// directory of shards with or without model.safetensors.index.json), and writing them.
//
// Everything read from disk is untrusted. A File or Checkpoint returned by the readers below has
// passed every rule in plugins/disk/README.md ("Validation"): the header is bounded UTF-8 JSON
// with no duplicate keys, every entry has a known dtype and a byte span equal to its shape's
// size (overflow-checked), and the spans tile the data section exactly (start at 0, no gaps, no
// overlaps, nothing past the end). A violation throws ferry::Error with CORRUPT_DATA (NOT_FOUND or
// IO for files that are missing or unreadable) whose one-line message names the file, the tensor
// and the rule.
//
// Threading: free functions with no shared state; a File is a plain value (its descriptor, when
// kept open, is only read with pread, which any number of threads may do at once).
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::safetensors {

// Largest header the reader accepts (the same bound as the reference implementation).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// Deepest JSON nesting accepted in a header or an index (a real header nests 3 levels).
inline constexpr int kMaxJsonDepth = 16;
// File name of the index of a sharded checkpoint.
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// One tensor of a file. begin/end are byte offsets into the data section (after the header).
struct TensorInfo {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t size() const noexcept { return end - begin; }
};

// An owned POSIX file descriptor (move-only; closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const noexcept { return fd_; }
  int release() noexcept;

 private:
  int fd_ = -1;
};

// Reads exactly dst.size() bytes at `offset` of `fd` (retrying short reads and EINTR). Throws
// ferry::Error IO naming `path` on an error or when the file ends early. Any thread.
void read_at(int fd, std::span<std::uint8_t> dst, std::uint64_t offset, std::string_view path);

// One validated safetensors file.
struct File {
  std::string path;                // as opened (used in every message)
  std::uint64_t file_size = 0;     // bytes
  std::uint64_t header_bytes = 0;  // N, the JSON header length
  std::map<std::string, std::string> metadata;  // __metadata__ (empty when absent)
  std::vector<TensorInfo> tensors;  // sorted by begin (then name)
  Fd fd;  // open for reading when read_file(path, keep_open = true); else -1

  // Byte offset of the data section in the file (8 + N).
  std::uint64_t data_offset() const noexcept { return 8 + header_bytes; }
  // Length of the data section.
  std::uint64_t data_bytes() const noexcept { return file_size - data_offset(); }
};

// Opens, reads and validates the header of the file at `path`. With keep_open the descriptor
// that was validated stays open in File::fd, so later reads see the same file even if the path
// is replaced. Throws ferry::Error (NOT_FOUND, IO, CORRUPT_DATA).
File read_file(const std::string& path, bool keep_open = false);

// Validates a header (the N bytes after the length prefix) against a data section of
// `data_bytes`. `label` names the file in messages. Returns a File without path/size fields set
// beyond what the header gives. Exposed for tests and fuzzing.
File parse_header(std::string_view label, std::string_view header, std::uint64_t data_bytes);

// A checkpoint: one file, or the shards of a directory.
struct Checkpoint {
  std::string path;        // as given
  std::string index_path;  // model.safetensors.index.json when one was used; else ""
  std::vector<File> files;  // sorted by path

  std::size_t tensor_count() const noexcept;
  std::uint64_t total_bytes() const noexcept;  // sum of tensor sizes
};

// Reads and validates a checkpoint:
//  - a .safetensors file;
//  - a model.safetensors.index.json file, or a directory holding one: its "weight_map"
//    {tensor: file} names every shard; every shard must exist and be valid, and the tensors of
//    the shards must be exactly those of the index, each in the file the index names;
//  - a directory without an index: every *.safetensors file in it, whose tensor names must not
//    collide.
// Throws ferry::Error (NOT_FOUND, IO, CORRUPT_DATA) naming the file, tensor and rule.
Checkpoint read_checkpoint(const std::string& path, bool keep_open = false);

// ---- writing -------------------------------------------------------------------------------

// A tensor to write: its bytes are borrowed for the duration of the call.
struct TensorData {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::span<const std::uint8_t> bytes;
};

// Writes a safetensors file with the tensors laid out contiguously in the given order and the
// header padded with spaces to a multiple of 8 bytes. Names must be unique, non-empty and not
// "__metadata__"; bytes must equal product(shape) x dtype size (INVALID_ARGUMENT otherwise).
// Writes to "<path>.tmp" and renames, so readers never see a half-written file. IO on failure.
void write_safetensors(const std::string& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a model.safetensors.index.json: {"metadata": {"total_size": total_bytes},
// "weight_map": weight_map}. Same atomic rename as write_safetensors.
void write_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                 std::uint64_t total_bytes);

}  // namespace ferry::safetensors
