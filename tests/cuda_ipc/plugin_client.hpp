// tests/cuda_ipc/plugin_client.hpp: what the CUDA IPC tests and their peer helper share: loading
// libferry_transport_cuda_ipc.so (path in FERRY_CUDA_IPC_PLUGIN) through its C entry, small RAII
// wrappers over its table that throw ferry::Error, hex for blobs on the helper's command pipe,
// and the byte pattern both processes compute to check transfers bit for bit.
#pragma once

#include <dlfcn.h>
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <dirent.h>
#include <time.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/host_api.hpp"

namespace ferry::cuda_ipc::test {

inline std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
inline std::int64_t in_seconds(int s) { return now_ns() + std::int64_t{s} * 1'000'000'000; }

// The plugin's table; throws when it cannot be loaded.
inline const ferry_transport_api_t* plugin() {
  static const ferry_transport_api_t* api = [] {
    const char* path = std::getenv("FERRY_CUDA_IPC_PLUGIN");
    if (path == nullptr) fail(FERRY_STATUS_NOT_FOUND, "set FERRY_CUDA_IPC_PLUGIN");
    void* handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) fail(FERRY_STATUS_NOT_FOUND, "dlopen: {}", ::dlerror());
    auto negotiate =
        reinterpret_cast<ferry_plugin_negotiate_fn>(::dlsym(handle, FERRY_PLUGIN_ENTRY_SYMBOL));
    if (negotiate == nullptr) fail(FERRY_STATUS_NOT_FOUND, "no {}", FERRY_PLUGIN_ENTRY_SYMBOL);
    static ferry_plugin_negotiation_t n{};
    n.struct_size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, api);
    n.host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
    n.host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
    n.host = host_api_table();
    throw_if_error(negotiate(&n), "negotiate");
    if (std::string(n.name) != "cuda_ipc") fail(FERRY_STATUS_INTERNAL, "plugin named {}", n.name);
    return static_cast<const ferry_transport_api_t*>(n.api);
  }();
  return api;
}

inline std::vector<std::uint8_t> take(ferry_blob_t& blob) {
  std::vector<std::uint8_t> bytes(blob.data, blob.data + blob.size);
  if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
  return bytes;
}

inline ferry_blob_t borrow(const std::vector<std::uint8_t>& bytes) {
  ferry_blob_t b{};
  b.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  b.data = bytes.data();
  b.size = bytes.size();
  return b;
}

// One transport instance driven through the C table, the way the session layer does.
class Transport {
 public:
  explicit Transport(ferry_role_t role, int device = 0,
                     std::vector<ferry_option_t> options = {}) {
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = role;
    args.options = options.data();
    args.num_options = options.size();
    args.device = device;
    throw_if_error(api()->create(&args, &t_), "create");
  }
  ~Transport() {
    for (auto* m : memory_) api()->deregister_memory(t_, m);
    if (peer_ != nullptr) api()->disconnect(t_, peer_);
    api()->destroy(t_);
  }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  static const ferry_transport_api_t* api() { return plugin(); }
  ferry_transport_t* get() const { return t_; }
  ferry_peer_t* peer() const { return peer_; }

  std::vector<std::uint8_t> address() {
    ferry_blob_t b{};
    throw_if_error(api()->get_address(t_, &b), "get_address");
    return take(b);
  }
  void connect(const std::vector<std::uint8_t>& remote, const std::string& name) {
    ferry_blob_t b = borrow(remote);
    ferry_connect_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    args.remote_addresses = &b;
    args.num_remote = 1;
    args.group_size = 2;
    args.peer_name = name.c_str();
    args.deadline_ns = in_seconds(30);
    throw_if_error(api()->connect(t_, &args, &peer_), "connect to " + name);
  }
  void disconnect() {
    if (peer_ != nullptr) api()->disconnect(t_, peer_);
    peer_ = nullptr;
  }
  ferry_memory_t* register_memory(void* base, std::uint64_t size, ferry_memory_kind_t kind,
                                  int device = 0) {
    ferry_memory_desc_t d{};
    d.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    d.base = base;
    d.size = size;
    d.kind = kind;
    d.device = device;
    ferry_memory_t* m = nullptr;
    throw_if_error(api()->register_memory(t_, &d, &m), "register_memory");
    memory_.push_back(m);
    return m;
  }
  void deregister(ferry_memory_t* m) {
    std::erase(memory_, m);
    api()->deregister_memory(t_, m);
  }
  std::vector<std::uint8_t> pack_key(ferry_memory_t* m) {
    ferry_blob_t b{};
    throw_if_error(api()->pack_key(t_, m, &b), "pack_key");
    return take(b);
  }
  // Waits for and frees a request.
  void finish(ferry_request_t* r, const std::string& what, int seconds = 60) {
    if (r == nullptr) return;
    ferry_error_t* e = api()->request_wait(t_, r, in_seconds(seconds));
    api()->request_free(t_, r);
    throw_if_error(e, what);
  }
  void put(ferry_memory_t* local, std::uint64_t offset, std::uint64_t size,
           const std::vector<std::uint8_t>& key, std::uint64_t remote_offset) {
    ferry_blob_t k = borrow(key);
    ferry_put_args_t a{};
    a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    a.local = range(local, offset, size);
    a.remote_key = &k;
    a.remote_offset = remote_offset;
    a.deadline_ns = in_seconds(30);
    ferry_request_t* r = nullptr;
    throw_if_error(api()->put(t_, peer_, &a, &r), "put");
    finish(r, "put");
  }
  void flush() {
    ferry_request_t* r = nullptr;
    throw_if_error(api()->flush(t_, peer_, in_seconds(30), &r), "flush");
    finish(r, "flush");
  }
  ferry_request_t* send_bucket(ferry_memory_t* m, std::uint64_t size, std::uint32_t index) {
    auto io = bucket(m, size, index);
    ferry_request_t* r = nullptr;
    throw_if_error(api()->send_bucket(t_, peer_, &io, &r), "send_bucket");
    return r;
  }
  ferry_request_t* recv_bucket(ferry_memory_t* m, std::uint64_t size, std::uint32_t index) {
    auto io = bucket(m, size, index);
    ferry_request_t* r = nullptr;
    throw_if_error(api()->recv_bucket(t_, peer_, &io, &r), "recv_bucket");
    return r;
  }
  static ferry_memory_range_t range(ferry_memory_t* m, std::uint64_t offset, std::uint64_t size) {
    ferry_memory_range_t r{};
    r.struct_size = FERRY_STRUCT_SIZE(ferry_memory_range_t, size);
    r.memory = m;
    r.offset = offset;
    r.size = size;
    return r;
  }
  static ferry_bucket_io_t bucket(ferry_memory_t* m, std::uint64_t size, std::uint32_t index) {
    ferry_bucket_io_t io{};
    io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
    io.data = range(m, 0, size);
    io.bucket_index = index;
    io.deadline_ns = in_seconds(30);
    return io;
  }

 private:
  ferry_transport_t* t_ = nullptr;
  ferry_peer_t* peer_ = nullptr;
  std::vector<ferry_memory_t*> memory_;
};

inline std::string hex(const std::vector<std::uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : bytes) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}
inline std::vector<std::uint8_t> unhex(const std::string& s) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoul(s.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The expected contents of a transfer: byte i of pattern `seed`.
inline std::vector<std::uint8_t> pattern(std::uint64_t seed, std::uint64_t bytes) {
  std::vector<std::uint8_t> out(bytes);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::uint64_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::uint8_t>(x >> 32);
  }
  return out;
}

inline std::size_t count_entries(const char* dir_path) {
  std::size_t n = 0;
  DIR* dir = ::opendir(dir_path);
  if (dir == nullptr) return 0;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n;
}
inline std::size_t open_fds() { return count_entries("/proc/self/fd"); }

}  // namespace ferry::cuda_ipc::test
