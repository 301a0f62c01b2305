// ucx/ucx_wire.cpp: framing and validation of the UCX transport's address and key blobs.
#include "ucx_wire.hpp"

#include <ferry/sdk/error.hpp>

#include <cstring>

namespace ferry::ucx {
namespace {

constexpr char kAddressMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'U', 'C', 'A'};
constexpr char kKeyMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'U', 'C', 'K'};
constexpr std::uint32_t kAddressVersion = 1;
// 2: the key carries the owner's shared segment (alloc_memory) and process space.
constexpr std::uint32_t kKeyVersion = 2;
constexpr std::size_t kMaxPayload = 1u << 20;  // UCX addresses and rkeys are far smaller

// Appends and reads fixed-width little-endian-as-native fields; both sides are the same
// architecture (x86-64/aarch64 little endian), and the magic would not match otherwise.
class Writer {
 public:
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <typename T>
  void pod(T v) { bytes(&v, sizeof v); }
  void text(const std::string& s) {
    pod<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void block(const std::vector<std::uint8_t>& v) {
    pod<std::uint64_t>(v.size());
    bytes(v.data(), v.size());
  }
  // Appends the checksum of everything written so far.
  std::vector<std::uint8_t> finish() {
    const std::uint64_t sum = fnv1a64(out_);
    pod(sum);
    return std::move(out_);
  }

 private:
  std::vector<std::uint8_t> out_;
};

class Reader {
 public:
  Reader(std::span<const std::uint8_t> blob, const std::string& what, const char* kind)
      : blob_(blob), what_(what), kind_(kind) {}
  void bytes(void* p, std::size_t n) {
    if (n > blob_.size() - pos_) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} blob is truncated ({} bytes)", what_, kind_,
           blob_.size());
    }
    std::memcpy(p, blob_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T pod() {
    T v{};
    bytes(&v, sizeof v);
    return v;
  }
  std::string text() {
    const auto n = pod<std::uint32_t>();
    if (n > 4096) bad("a text field claims {} bytes", n);
    std::string s(n, '\0');
    bytes(s.data(), n);
    return s;
  }
  std::vector<std::uint8_t> block() {
    const auto n = pod<std::uint64_t>();
    if (n > kMaxPayload) bad("a payload claims {} bytes", n);
    std::vector<std::uint8_t> v(n);
    bytes(v.data(), n);
    return v;
  }
  void magic(const char (&expected)[8], std::uint32_t expected_version) {
    char m[8];
    bytes(m, 8);
    if (std::memcmp(m, expected, 8) != 0) bad("wrong magic; not a ferry UCX {} blob", kind_);
    const auto version = pod<std::uint32_t>();
    if (version != expected_version) {
      fail(FERRY_STATUS_INCOMPATIBLE, "{}: {} blob has format version {}, this plugin reads {}",
           what_, kind_, version, expected_version);
    }
  }
  // Reads the trailing checksum and checks it covers exactly the rest of the blob.
  std::uint64_t verify_end() {
    const std::size_t body = pos_;
    const auto sum = pod<std::uint64_t>();
    if (pos_ != blob_.size()) bad("{} trailing bytes", blob_.size() - pos_);
    if (sum != fnv1a64(blob_.first(body))) bad("checksum mismatch (corrupted in transit?)");
    return sum;
  }
  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: invalid {} blob: {}", what_, kind_,
         fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  std::span<const std::uint8_t> blob_;
  std::size_t pos_ = 0;
  const std::string& what_;
  const char* kind_;
};

}  // namespace

std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
  std::uint64_t h = seed;
  for (std::uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<std::uint8_t> encode_address(const AddressInfo& info) {
  Writer w;
  w.bytes(kAddressMagic, 8);
  w.pod(kAddressVersion);
  w.pod<std::uint32_t>(info.error_mode);
  w.pod(info.pid);
  w.text(info.process_space);
  w.text(info.host);
  w.block(info.worker_address);
  return w.finish();
}

AddressInfo decode_address(std::span<const std::uint8_t> blob, const std::string& what) {
  Reader r(blob, what, "UCX worker address");
  AddressInfo info;
  r.magic(kAddressMagic, kAddressVersion);
  const auto mode = r.pod<std::uint32_t>();
  if (mode > 2) r.bad("error mode {}", mode);
  info.error_mode = mode;
  info.pid = r.pod<std::uint32_t>();
  info.process_space = r.text();
  info.host = r.text();
  info.worker_address = r.block();
  r.verify_end();
  if (info.worker_address.empty()) r.bad("empty worker address");
  return info;
}

std::vector<std::uint8_t> encode_key(const KeyInfo& info) {
  Writer w;
  w.bytes(kKeyMagic, 8);
  w.pod(kKeyVersion);
  w.pod(info.base);
  w.pod(info.size);
  w.block(info.packed_rkey);
  w.pod(info.segment.pid);
  w.pod(info.segment.fd);
  w.pod(info.segment.device);
  w.pod(info.segment.inode);
  w.pod(info.segment.size);
  w.text(info.process_space);
  return w.finish();
}

KeyInfo decode_key(std::span<const std::uint8_t> blob, const std::string& what) {
  Reader r(blob, what, "remote key");
  KeyInfo info;
  r.magic(kKeyMagic, kKeyVersion);
  info.base = r.pod<std::uint64_t>();
  info.size = r.pod<std::uint64_t>();
  info.packed_rkey = r.block();
  info.segment.pid = r.pod<std::uint32_t>();
  info.segment.fd = r.pod<std::int32_t>();
  info.segment.device = r.pod<std::uint64_t>();
  info.segment.inode = r.pod<std::uint64_t>();
  info.segment.size = r.pod<std::uint64_t>();
  info.process_space = r.text();
  info.checksum = r.verify_end();
  if (info.base + info.size < info.base) r.bad("range [{:#x}, +{}) overflows", info.base, info.size);
  if (info.segment.pid != 0 && (info.segment.fd < 0 || info.segment.size < info.size)) {
    r.bad("segment (fd {}, {} bytes) does not cover the {} bytes of the key", info.segment.fd,
          info.segment.size, info.size);
  }
  return info;
}

std::uint32_t stream_id(std::span<const std::uint8_t> sender_worker_address) {
  const std::uint64_t h = fnv1a64(sender_worker_address);
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

}  // namespace ferry::ucx
