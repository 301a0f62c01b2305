// The host mirror: layout, file format (create / validated reopen), slot copies and the
// committed-version record (see store/host_mirror.hpp).
#include "store/host_mirror.hpp"

#include "common/log.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <unordered_set>

namespace ferry::store {
namespace {

constexpr char kMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'M', 'I', 'R'};
// 2: owner metadata, the committed record's time and checksum, notes of why nothing is committed.
// 3: the entries' fingerprints are xxh64-interleaved-v1 (they were xxh64-chunked-v1).
constexpr std::uint32_t kFormatVersion = 3;
constexpr std::uint64_t kHeaderAlign = 4096;
constexpr std::uint64_t kEntryAlign = 256;
constexpr std::uint64_t kLabelArea = 256;
constexpr std::uint64_t kMaxEntries = 1u << 24;
constexpr std::uint64_t kMaxNameBytes = 4096;
constexpr std::uint64_t kCopyChunk = 16ull << 20;
constexpr std::uint64_t kParallelThreshold = 32ull << 20;

struct FileHeader {
  char magic[8];
  std::uint32_t format_version;
  std::uint32_t has_committed;  // written last (release) / cleared first
  std::uint64_t header_bytes;
  std::uint64_t data_bytes;
  std::uint64_t num_entries;
  std::uint64_t table_bytes;
  std::uint64_t table_hash;
  std::uint64_t committed_version;
  std::uint32_t label_bytes;     // of the committed label (label area) while one is committed
  std::uint32_t note_bytes;      // of the note (label area) while none is; 0: no note recorded
  std::uint64_t metadata_bytes;  // the owner's metadata, right after the table
  std::uint64_t committed_at_ns;  // system clock, nanoseconds since the epoch
  std::uint64_t commit_hash;     // xxh64 of the committed record (HostMirror::commit_record_hash)
  std::uint8_t reserved[32];
};
static_assert(sizeof(FileHeader) == 128, "the mirror header is 128 bytes");

struct EntryState {
  std::uint64_t fingerprint;
  std::uint64_t filled;
};
static_assert(sizeof(EntryState) == 16);

constexpr std::uint64_t kLabelOffset = sizeof(FileHeader);
constexpr std::uint64_t kStateOffset = kLabelOffset + kLabelArea;

std::uint64_t align_up(std::uint64_t value, std::uint64_t align) {
  auto sum = checked_add(value, align - 1);
  if (!sum) fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: size {} overflows", value);
  return *sum / align * align;
}

std::string describe(const MirrorParam& p) {
  return fmt::format("'{}' {} {} (tag '{}')", p.name, dtype_name(p.dtype), shape_string(p.shape),
                     p.tag);
}

std::vector<MirrorEntry> lay_out(std::vector<MirrorParam> layout, std::uint64_t& data_bytes) {
  std::vector<MirrorEntry> entries;
  entries.reserve(layout.size());
  std::unordered_set<std::string> names;
  std::uint64_t cursor = 0;
  for (auto& param : layout) {
    if (param.name.empty() || param.name.size() > kMaxNameBytes) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: parameter name '{}' is empty or too long",
           param.name);
    }
    if (!names.insert(param.name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: parameter '{}' appears twice", param.name);
    }
    if (param.shape.size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: parameter '{}' has {} dims (max {})",
           param.name, param.shape.size(), FERRY_MAX_DIMS);
    }
    auto bytes = byte_size(param.dtype, param.shape);
    if (!bytes) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: parameter {} has no valid byte size",
           describe(param));
    }
    MirrorEntry entry;
    entry.offset = align_up(cursor, kEntryAlign);
    entry.bytes = *bytes;
    auto end = checked_add(entry.offset, entry.bytes);
    if (!end) fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: layout size overflows");
    cursor = *end;
    entry.param = std::move(param);
    entries.push_back(std::move(entry));
  }
  data_bytes = align_up(cursor, kHeaderAlign);
  return entries;
}

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<std::byte>& out, const std::string& s) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

std::vector<std::byte> serialize_table(const std::vector<MirrorEntry>& entries) {
  std::vector<std::byte> out;
  for (const auto& e : entries) {
    put_string(out, e.param.name);
    put_string(out, e.param.tag);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(e.param.dtype));
    put<std::uint32_t>(out, static_cast<std::uint32_t>(e.param.shape.size()));
    for (auto dim : e.param.shape) put<std::uint64_t>(out, dim);
    put<std::uint64_t>(out, e.offset);
    put<std::uint64_t>(out, e.bytes);
  }
  return out;
}

// Reads the table of an untrusted file; every read is bounds-checked.
class TableReader {
 public:
  TableReader(const std::byte* data, std::uint64_t size, const std::filesystem::path& path)
      : data_(data), size_(size), path_(path) {}

  template <typename T>
  T get() {
    if (size_ - pos_ < sizeof(T)) truncated();
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string get_string() {
    auto n = get<std::uint32_t>();
    if (n > kMaxNameBytes || size_ - pos_ < n) truncated();
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  bool at_end() const { return pos_ == size_; }

 private:
  [[noreturn]] void truncated() const {
    fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: parameter table is truncated at byte {}",
         path_.string(), pos_);
  }
  const std::byte* data_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  const std::filesystem::path& path_;
};

std::string errno_text() { return std::strerror(errno); }

// Takes the exclusive lock that marks a mirror file in use; false when another open file still
// holds it after kLockWait (a running process). The wait is for a receiver that was just killed:
// its lock goes with the last reference to the open file, and where a GPU driver had the file's
// mapping page-locked that reference can outlive the reaped process for a moment (seen on an
// H200: a restart right after SIGKILL found the file locked), while a supervisor restarts at once.
constexpr auto kLockWait = std::chrono::seconds(5);
bool lock_file(int fd, const std::string& name) {
  const auto until = std::chrono::steady_clock::now() + kLockWait;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK) {
      fail(FERRY_STATUS_IO, "host mirror {}: cannot lock: {}", name, errno_text());
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

[[noreturn]] void fail_in_use(const std::string& name) {
  fail(FERRY_STATUS_FAILED_PRECONDITION,
       "host mirror {}: the file is in use by another running process (still after {} s; two "
       "receivers must not share a memory.mirror_path)",
       name, std::chrono::duration_cast<std::chrono::seconds>(kLockWait).count());
}

constexpr std::string_view kNeverCommitted = "it was created and has held no committed version yet";

}  // namespace

void copy_parallel(std::span<const CopyJob> jobs, unsigned threads) {
  std::uint64_t total = 0;
  for (const auto& job : jobs) total += job.bytes;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (threads <= 1 || total < kParallelThreshold) {
    for (const auto& job : jobs) {
      if (job.bytes > 0) std::memcpy(job.dst, job.src, job.bytes);
    }
    return;
  }
  struct Chunk {
    std::byte* dst;
    const std::byte* src;
    std::uint64_t bytes;
  };
  std::vector<Chunk> chunks;
  for (const auto& job : jobs) {
    for (std::uint64_t at = 0; at < job.bytes; at += kCopyChunk) {
      chunks.push_back({static_cast<std::byte*>(job.dst) + at,
                        static_cast<const std::byte*>(job.src) + at,
                        std::min(kCopyChunk, job.bytes - at)});
    }
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < chunks.size(); i = next.fetch_add(1)) {
      std::memcpy(chunks[i].dst, chunks[i].src, chunks[i].bytes);
    }
  };
  const auto helpers = std::min<std::size_t>(threads, chunks.size()) - 1;
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  try {
    for (std::size_t i = 0; i < helpers; ++i) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // Fewer threads than asked: the calling thread and those started still finish every chunk.
  }
  work();
  for (auto& t : pool) t.join();
}

std::unique_ptr<HostMirror> HostMirror::build(std::vector<MirrorParam> layout, unsigned threads,
                                              int fd, const std::filesystem::path& path,
                                              std::string_view metadata) {
  if (metadata.size() > kMirrorMetadataMax) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: {} bytes of metadata (at most {})",
         metadata.size(), kMirrorMetadataMax);
  }
  std::unique_ptr<HostMirror> mirror(new HostMirror());
  mirror->threads_ = threads;
  mirror->metadata_ = std::string(metadata);
  mirror->entries_ = lay_out(std::move(layout), mirror->data_bytes_);
  mirror->index_entries();
  auto table = serialize_table(mirror->entries_);
  const std::uint64_t table_bytes = table.size();
  const auto* meta = reinterpret_cast<const std::byte*>(metadata.data());
  table.insert(table.end(), meta, meta + metadata.size());
  const std::uint64_t n = mirror->entries_.size();
  const std::uint64_t table_offset = kStateOffset + n * sizeof(EntryState);
  mirror->header_bytes_ = align_up(table_offset + table.size(), kHeaderAlign);
  auto total = checked_add(mirror->header_bytes_, mirror->data_bytes_);
  if (!total) fail(FERRY_STATUS_INVALID_ARGUMENT, "host mirror: size overflows");
  mirror->mapping_bytes_ = *total;

  void* base = MAP_FAILED;
  if (fd >= 0) {
    if (::ftruncate(fd, static_cast<off_t>(*total)) != 0) {
      fail(FERRY_STATUS_IO, "host mirror {}: cannot size the file to {} bytes: {}", path.string(),
           *total, errno_text());
    }
    base = ::mmap(nullptr, *total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    base = ::mmap(nullptr, *total, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  if (base == MAP_FAILED) {
    fail(FERRY_STATUS_OUT_OF_MEMORY, "host mirror{}: cannot map {} bytes: {}",
         path.empty() ? "" : " " + path.string(), *total, errno_text());
  }
  mirror->base_ = static_cast<std::byte*>(base);

  FileHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.format_version = kFormatVersion;
  header.has_committed = 0;
  header.header_bytes = mirror->header_bytes_;
  header.data_bytes = mirror->data_bytes_;
  header.num_entries = n;
  header.table_bytes = table_bytes;
  header.metadata_bytes = metadata.size();
  header.table_hash = XXH64(table.data(), table.size(), 0);
  header.note_bytes = static_cast<std::uint32_t>(kNeverCommitted.size());
  std::memcpy(mirror->base_, &header, sizeof(header));
  std::memcpy(mirror->base_ + kLabelOffset, kNeverCommitted.data(), kNeverCommitted.size());
  std::memset(mirror->base_ + kStateOffset, 0, n * sizeof(EntryState));
  if (!table.empty()) std::memcpy(mirror->base_ + table_offset, table.data(), table.size());
  return mirror;
}

std::unique_ptr<HostMirror> HostMirror::anonymous(std::vector<MirrorParam> layout,
                                                  unsigned threads) {
  return build(std::move(layout), threads, -1, {}, {});
}

std::unique_ptr<HostMirror> HostMirror::create_file(const std::filesystem::path& path,
                                                    std::vector<MirrorParam> layout,
                                                    unsigned threads, std::string_view metadata) {
  // The file it replaces must not be the mirror of a running process.
  if (const int old = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); old >= 0) {
    bool free = false;
    try {
      free = lock_file(old, path.string());
    } catch (...) {
      ::close(old);
      throw;
    }
    ::close(old);
    if (!free) fail_in_use(path.string());
  }
  auto temp = path;
  temp += fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    fail(FERRY_STATUS_IO, "host mirror {}: cannot create: {}", temp.string(), errno_text());
  }
  std::unique_ptr<HostMirror> mirror;
  try {
    if (!lock_file(fd, temp.string())) fail_in_use(temp.string());
    mirror = build(std::move(layout), threads, fd, path, metadata);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  mirror->lock_fd_ = fd;  // closed (unlocked) by the destructor
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const auto why = errno_text();
    ::unlink(temp.c_str());
    fail(FERRY_STATUS_IO, "host mirror {}: cannot rename into place: {}", path.string(), why);
  }
  mirror->path_ = path;
  logger("store")->info("host mirror {} created: {} parameters, {} data bytes", path.string(),
                        mirror->entries_.size(), mirror->data_bytes_);
  return mirror;
}

std::unique_ptr<HostMirror> HostMirror::open_file(const std::filesystem::path& path,
                                                  const std::vector<MirrorParam>* expected,
                                                  unsigned threads) {
  const std::string name = path.string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail(FERRY_STATUS_NOT_FOUND, "host mirror {}: no such file", name);
    fail(FERRY_STATUS_IO, "host mirror {}: cannot open: {}", name, errno_text());
  }
  try {
    if (!lock_file(fd, name)) fail_in_use(name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const auto why = errno_text();
    ::close(fd);
    fail(FERRY_STATUS_IO, "host mirror {}: cannot stat: {}", name, why);
  }
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  FileHeader header{};
  if (file_bytes < sizeof(header) ||
      ::pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    ::close(fd);
    fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: file of {} bytes is shorter than a header",
         name, file_bytes);
  }
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: {}", name, why);
  };
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) refuse("not a ferry mirror (bad magic)");
  if (header.format_version != kFormatVersion) {
    refuse(fmt::format("format version {} is not the supported {}", header.format_version,
                       kFormatVersion));
  }
  if (header.num_entries > kMaxEntries) refuse(fmt::format("{} entries", header.num_entries));
  const std::uint64_t table_offset = kStateOffset + header.num_entries * sizeof(EntryState);
  const auto table_end = checked_add(table_offset, header.table_bytes);
  const auto metadata_end =
      table_end ? checked_add(*table_end, header.metadata_bytes) : std::nullopt;
  if (!metadata_end || *metadata_end > header.header_bytes ||
      header.header_bytes % kHeaderAlign != 0 || header.metadata_bytes > kMirrorMetadataMax) {
    refuse("header sizes are inconsistent");
  }
  const auto total = checked_add(header.header_bytes, header.data_bytes);
  if (!total || *total != file_bytes) {
    refuse(fmt::format("file is {} bytes but the header describes {}", file_bytes,
                       total ? *total : 0));
  }
  if (header.label_bytes > kMirrorLabelMax || header.note_bytes > kMirrorLabelMax) {
    refuse("label length exceeds the label area");
  }

  void* base = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const auto map_errno = errno;
  if (base == MAP_FAILED) {
    ::close(fd);
    fail(FERRY_STATUS_IO, "host mirror {}: cannot map: {}", name, std::strerror(map_errno));
  }
  std::unique_ptr<HostMirror> mirror(new HostMirror());
  mirror->lock_fd_ = fd;  // from here the destructor unmaps and unlocks
  mirror->base_ = static_cast<std::byte*>(base);
  mirror->mapping_bytes_ = file_bytes;
  mirror->header_bytes_ = header.header_bytes;
  mirror->data_bytes_ = header.data_bytes;
  mirror->threads_ = threads;
  mirror->path_ = path;

  const std::byte* table = mirror->base_ + table_offset;
  if (XXH64(table, header.table_bytes + header.metadata_bytes, 0) != header.table_hash) {
    fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: parameter table checksum mismatch", name);
  }
  mirror->metadata_.assign(reinterpret_cast<const char*>(table + header.table_bytes),
                           header.metadata_bytes);
  TableReader reader(table, header.table_bytes, path);
  std::uint64_t previous_end = 0;
  for (std::uint64_t i = 0; i < header.num_entries; ++i) {
    MirrorEntry e;
    e.param.name = reader.get_string();
    e.param.tag = reader.get_string();
    e.param.dtype = static_cast<ferry_dtype_t>(reader.get<std::uint32_t>());
    const auto ndim = reader.get<std::uint32_t>();
    if (ndim > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: entry {} has {} dims", name, i, ndim);
    }
    for (std::uint32_t d = 0; d < ndim; ++d) e.param.shape.push_back(reader.get<std::uint64_t>());
    e.offset = reader.get<std::uint64_t>();
    e.bytes = reader.get<std::uint64_t>();
    const auto bytes = byte_size(e.param.dtype, e.param.shape);
    const auto end = checked_add(e.offset, e.bytes);
    if (!bytes || *bytes != e.bytes || !end || *end > header.data_bytes ||
        e.offset < previous_end || e.offset % kEntryAlign != 0) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "host mirror {}: entry {} ('{}') has an invalid size or offset", name, i,
           e.param.name);
    }
    previous_end = *end;
    mirror->entries_.push_back(std::move(e));
  }
  if (!reader.at_end()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "host mirror {}: trailing bytes after the parameter table",
         name);
  }
  mirror->index_entries();
  if (header.has_committed != 0 && mirror->commit_record_hash() != header.commit_hash) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "host mirror {}: the record of committed version {} is damaged (checksum mismatch over "
         "its version, time, label and fingerprints)",
         name, header.committed_version);
  }
  if (expected != nullptr) mirror->check_layout(*expected);
  logger("store")->info("host mirror {} reopened: {} parameters{}", name, mirror->entries_.size(),
                        mirror->committed() ? fmt::format(", committed version {}",
                                                          mirror->committed()->number)
                                            : std::string(", no committed version"));
  return mirror;
}

HostMirror::~HostMirror() {
  if (base_ != nullptr) ::munmap(base_, mapping_bytes_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::optional<std::size_t> HostMirror::find(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void HostMirror::index_entries() {
  index_.clear();
  index_.reserve(entries_.size());
  for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].param.name, i);
}

void HostMirror::check_layout(std::span<const MirrorParam> layout) const {
  const std::string where = path_.empty() ? std::string("host mirror") : "host mirror " + path_.string();
  const std::size_t common = std::min(layout.size(), entries_.size());
  for (std::size_t i = 0; i < common; ++i) {
    const auto& have = entries_[i].param;
    const auto& want = layout[i];
    if (have.name != want.name || have.tag != want.tag || have.dtype != want.dtype ||
        have.shape != want.shape) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "{}: layout differs from this store: parameter {} is {} in the mirror but {} here",
           where, i, describe(have), describe(want));
    }
  }
  if (layout.size() != entries_.size()) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "{}: layout differs from this store: the mirror holds {} parameters, this store {}{}",
         where, entries_.size(), layout.size(),
         layout.size() > entries_.size()
             ? fmt::format(" (first missing: '{}')", layout[common].name)
             : fmt::format(" (first extra: '{}')", entries_[common].param.name));
  }
}

std::byte* HostMirror::slot(std::size_t index) {
  return base_ + header_bytes_ + entries_.at(index).offset;
}

const std::byte* HostMirror::slot(std::size_t index) const {
  return base_ + header_bytes_ + entries_.at(index).offset;
}

bool HostMirror::filled(std::size_t index) const {
  (void)entries_.at(index);
  const auto* state = reinterpret_cast<const EntryState*>(base_ + kStateOffset) + index;
  return state->filled != 0;
}

void HostMirror::clear_filled(std::size_t index) {
  (void)entries_.at(index);
  auto* state = reinterpret_cast<EntryState*>(base_ + kStateOffset) + index;
  state->filled = 0;
}

void HostMirror::mark_filled(std::size_t index) {
  (void)entries_.at(index);
  auto* state = reinterpret_cast<EntryState*>(base_ + kStateOffset) + index;
  state->filled = 1;
}

void HostMirror::save(std::span<const std::size_t> entry,
                      std::span<const std::byte* const> sources) {
  if (entry.size() != sources.size()) {
    fail(FERRY_STATUS_INTERNAL, "host mirror save: {} entries but {} sources", entry.size(),
         sources.size());
  }
  std::vector<CopyJob> jobs;
  jobs.reserve(entry.size());
  auto* states = reinterpret_cast<EntryState*>(base_ + kStateOffset);
  for (std::size_t i = 0; i < entry.size(); ++i) {
    states[entry[i]].filled = 0;  // a copy interrupted half way must not count as one
    jobs.push_back({slot(entry[i]), sources[i], entries_[entry[i]].bytes});
  }
  copy_parallel(jobs, threads_);
  for (auto index : entry) states[index].filled = 1;
}

void HostMirror::restore(std::span<const std::size_t> entry,
                         std::span<std::byte* const> targets) const {
  if (entry.size() != targets.size()) {
    fail(FERRY_STATUS_INTERNAL, "host mirror restore: {} entries but {} targets", entry.size(),
         targets.size());
  }
  std::vector<CopyJob> jobs;
  jobs.reserve(entry.size());
  for (std::size_t i = 0; i < entry.size(); ++i) {
    if (!filled(entry[i])) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "host mirror holds no copy of parameter '{}'",
           entries_[entry[i]].param.name);
    }
    jobs.push_back({targets[i], slot(entry[i]), entries_[entry[i]].bytes});
  }
  copy_parallel(jobs, threads_);
}

std::optional<CommittedVersion> HostMirror::committed() const {
  auto* header = reinterpret_cast<FileHeader*>(base_);
  if (std::atomic_ref<std::uint32_t>(header->has_committed).load(std::memory_order_acquire) == 0) {
    return std::nullopt;
  }
  CommittedVersion version;
  version.number = header->committed_version;
  const auto n = std::min<std::uint64_t>(header->label_bytes, kMirrorLabelMax);
  version.label.assign(reinterpret_cast<const char*>(base_ + kLabelOffset), n);
  return version;
}

std::chrono::system_clock::time_point HostMirror::committed_at() const {
  const auto* header = reinterpret_cast<const FileHeader*>(base_);
  if (!committed()) return {};
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<
      std::chrono::system_clock::duration>(std::chrono::nanoseconds(header->committed_at_ns)));
}

std::uint64_t HostMirror::commit_record_hash() const {
  const auto* header = reinterpret_cast<const FileHeader*>(base_);
  XXH64_state_t* state = XXH64_createState();
  if (state == nullptr) fail(FERRY_STATUS_OUT_OF_MEMORY, "host mirror: no memory for a checksum");
  XXH64_reset(state, 0);
  XXH64_update(state, &header->committed_version, sizeof(header->committed_version));
  XXH64_update(state, &header->committed_at_ns, sizeof(header->committed_at_ns));
  XXH64_update(state, &header->table_hash, sizeof(header->table_hash));
  XXH64_update(state, &header->label_bytes, sizeof(header->label_bytes));
  XXH64_update(state, base_ + kLabelOffset, std::min<std::uint64_t>(header->label_bytes, kMirrorLabelMax));
  // The fingerprints, not the filled flags: a release's backup copy clears and sets those while
  // the version stays committed (a slot not filled is refused by restore, naming it).
  const auto* states = reinterpret_cast<const EntryState*>(base_ + kStateOffset);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    XXH64_update(state, &states[i].fingerprint, sizeof(states[i].fingerprint));
  }
  const auto hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

void HostMirror::set_committed(const CommittedVersion& version,
                               std::span<const std::uint64_t> fingerprints) {
  if (fingerprints.size() != entries_.size()) {
    fail(FERRY_STATUS_INTERNAL, "host mirror: {} fingerprints for {} entries", fingerprints.size(),
         entries_.size());
  }
  clear_committed();
  auto* header = reinterpret_cast<FileHeader*>(base_);
  auto* states = reinterpret_cast<EntryState*>(base_ + kStateOffset);
  for (std::size_t i = 0; i < entries_.size(); ++i) states[i].fingerprint = fingerprints[i];
  const auto n = std::min(version.label.size(), kMirrorLabelMax);
  std::memcpy(base_ + kLabelOffset, version.label.data(), n);
  header->label_bytes = static_cast<std::uint32_t>(n);
  header->committed_version = version.number;
  header->committed_at_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  header->commit_hash = commit_record_hash();
  std::atomic_ref<std::uint32_t>(header->has_committed).store(1, std::memory_order_release);
}

void HostMirror::clear_committed(std::string_view note) noexcept {
  // In this order, so that a process stopped half way leaves no claim, and a note only once it
  // is complete.
  auto* header = reinterpret_cast<FileHeader*>(base_);
  std::atomic_ref<std::uint32_t>(header->has_committed).store(0, std::memory_order_release);
  std::atomic_ref<std::uint32_t>(header->note_bytes).store(0, std::memory_order_release);
  const auto n = std::min(note.size(), kMirrorLabelMax);
  if (n == 0) return;
  std::memcpy(base_ + kLabelOffset, note.data(), n);
  std::atomic_ref<std::uint32_t>(header->note_bytes)
      .store(static_cast<std::uint32_t>(n), std::memory_order_release);
}

std::string HostMirror::uncommitted_reason() const {
  if (committed()) return {};
  const auto* header = reinterpret_cast<const FileHeader*>(base_);
  const auto n = std::min<std::uint64_t>(header->note_bytes, kMirrorLabelMax);
  if (n == 0) {
    return "its committed version was withdrawn and no reason was recorded (the process may have "
           "stopped right then)";
  }
  return std::string(reinterpret_cast<const char*>(base_ + kLabelOffset), n);
}

std::uint64_t HostMirror::fingerprint(std::size_t index) const {
  (void)entries_.at(index);
  const auto* state = reinterpret_cast<const EntryState*>(base_ + kStateOffset) + index;
  return state->fingerprint;
}

}  // namespace ferry::store
