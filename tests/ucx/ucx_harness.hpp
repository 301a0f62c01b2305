// tests/ucx/ucx_harness.hpp: drives libferry_transport_ucx.so through its C table for the tests:
// the plugin loaded once (dlopen, negotiated with the host's table), a Side owning one transport
// instance with throwing helpers, a byte pattern, a length-prefixed message channel over a
// socketpair, and a forked peer process whose exit status carries its verdict.
#pragma once

#include <ferry/plugin.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/process_channel.hpp"
#include "common/host_api.hpp"
#include "tests/common/plugin_loader.hpp"

namespace ferry::ucx_test {

using Options = std::vector<std::pair<std::string, std::string>>;
using Bytes = std::vector<std::uint8_t>;

inline std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
inline std::int64_t in_ms(std::int64_t ms) { return now_ns() + ms * 1'000'000; }

// The plugin, loaded once for the whole program (tests/common/plugin_loader.hpp); NULL after a
// test failure when it cannot be loaded.
inline const ferry_transport_api_t* api() {
  return test::load_transport_plugin("FERRY_UCX_PLUGIN", "ucx");
}

// A finished call: OK, or an error's code and message.
struct Status {
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
  bool ok() const { return code == FERRY_STATUS_OK; }
};

inline Status take(ferry_error_t* e) {
  ErrorPtr owned(e);
  return Status{error_code(e), error_message(e)};
}

// Throws std::runtime_error with the plugin's message (usable in forked children, where gtest
// assertions cannot report).
inline void check(ferry_error_t* e, const char* what) {
  const Status s = take(e);
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.message);
}

inline Bytes blob_bytes(ferry_blob_t blob) {
  Bytes out(blob.data, blob.data + blob.size);
  if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
  return out;
}

// Byte i of pattern `seed`: position dependent, so a shifted or truncated copy shows.
inline std::uint8_t pattern(std::uint64_t i, std::uint32_t seed) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  return static_cast<std::uint8_t>(x >> 56);
}
inline void fill(std::uint8_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}
// Index of the first wrong byte, or -1.
inline std::int64_t first_mismatch(const std::uint8_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (p[i] != pattern(i, seed)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

// One transport instance.
class Side {
 public:
  Side(ferry_role_t role, const Options& options) {
    std::vector<ferry_option_t> opts;
    for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = role;
    args.options = opts.data();
    args.num_options = opts.size();
    args.device = -1;
    check(api()->create(&args, &t_), "create");
  }
  ~Side() {
    if (t_ != nullptr) api()->destroy(t_);
  }
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  ferry_transport_t* get() const { return t_; }

  Bytes address() {
    ferry_blob_t blob{};
    check(api()->get_address(t_, &blob), "get_address");
    return blob_bytes(blob);
  }
  Status try_connect(const Bytes& remote, const char* name, ferry_peer_t** out,
                     std::int64_t deadline = 0) {
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    blob.data = remote.data();
    blob.size = remote.size();
    ferry_connect_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    args.remote_addresses = &blob;
    args.num_remote = 1;
    args.group_size = 2;
    args.peer_name = name;
    args.deadline_ns = deadline != 0 ? deadline : in_ms(30'000);
    return take(api()->connect(t_, &args, out));
  }
  ferry_peer_t* connect(const Bytes& remote, const char* name) {
    ferry_peer_t* peer = nullptr;
    const Status s = try_connect(remote, name, &peer);
    if (!s.ok()) throw std::runtime_error("connect: " + s.message);
    return peer;
  }
  ferry_memory_t* reg(void* base, std::uint64_t size) {
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.base = base;
    desc.size = size;
    desc.kind = FERRY_MEMORY_HOST;
    desc.device = -1;
    ferry_memory_t* m = nullptr;
    check(api()->register_memory(t_, &desc, &m), "register_memory");
    return m;
  }
  // `size` bytes of host memory the plugin allocates and registers (ABI 1.7 alloc_memory).
  ferry_memory_t* alloc(std::uint64_t size, std::uint8_t** data) {
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.size = size;
    desc.kind = FERRY_MEMORY_HOST;
    desc.device = -1;
    void* p = nullptr;
    ferry_memory_t* m = nullptr;
    if (api()->alloc_memory == nullptr) throw std::runtime_error("the plugin has no alloc_memory");
    check(api()->alloc_memory(t_, &desc, &p, &m), "alloc_memory");
    *data = static_cast<std::uint8_t*>(p);
    return m;
  }
  Bytes key(ferry_memory_t* memory) {
    ferry_blob_t blob{};
    check(api()->pack_key(t_, memory, &blob), "pack_key");
    return blob_bytes(blob);
  }
  static ferry_bucket_io_t bucket(ferry_memory_t* m, std::uint64_t offset, std::uint64_t size,
                                  std::uint32_t index, std::int64_t deadline) {
    ferry_bucket_io_t b{};
    b.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
    b.data = {FERRY_STRUCT_SIZE(ferry_memory_range_t, size), m, offset, size};
    b.bucket_index = index;
    b.deadline_ns = deadline;
    return b;
  }
  Status try_send(ferry_peer_t* peer, const ferry_bucket_io_t& b, ferry_request_t** out) {
    return take(api()->send_bucket(t_, peer, &b, out));
  }
  Status try_recv(ferry_peer_t* peer, const ferry_bucket_io_t& b, ferry_request_t** out) {
    return take(api()->recv_bucket(t_, peer, &b, out));
  }
  ferry_request_t* send(ferry_peer_t* peer, const ferry_bucket_io_t& b) {
    ferry_request_t* r = nullptr;
    check(api()->send_bucket(t_, peer, &b, &r), "send_bucket");
    return r;
  }
  ferry_request_t* recv(ferry_peer_t* peer, const ferry_bucket_io_t& b) {
    ferry_request_t* r = nullptr;
    check(api()->recv_bucket(t_, peer, &b, &r), "recv_bucket");
    return r;
  }
  Status try_put(ferry_peer_t* peer, ferry_memory_t* m, std::uint64_t offset, std::uint64_t size,
                 const Bytes& key, std::uint64_t remote_offset, ferry_request_t** out) {
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    blob.data = key.data();
    blob.size = key.size();
    ferry_put_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    args.local = {FERRY_STRUCT_SIZE(ferry_memory_range_t, size), m, offset, size};
    args.remote_key = &blob;
    args.remote_offset = remote_offset;
    args.deadline_ns = in_ms(60'000);
    return take(api()->put(t_, peer, &args, out));
  }
  ferry_request_t* flush(ferry_peer_t* peer) {
    ferry_request_t* r = nullptr;
    check(api()->flush(t_, peer, in_ms(60'000), &r), "flush");
    return r;
  }
  // Waits and frees the request; returns how it ended.
  Status finish(ferry_request_t* r, std::int64_t deadline = 0) {
    if (r == nullptr) return {};
    const Status s = take(api()->request_wait(t_, r, deadline != 0 ? deadline : in_ms(60'000)));
    api()->request_free(t_, r);
    return s;
  }
  void complete(ferry_request_t* r, const char* what) {
    const Status s = finish(r);
    if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.message);
  }

 private:
  ferry_transport_t* t_ = nullptr;
};

// A bidirectional, length-prefixed message channel (one end per process); throws ferry::Error.
class Channel : public bench::ProcessChannel {
 public:
  explicit Channel(int fd) : ProcessChannel(fd, "ucx test channel") {}
};

// A forked peer process running `body` with its channel end. Its exit status is 0 when body
// returned normally; a thrown message goes to stderr.
class PeerProcess {
 public:
  explicit PeerProcess(const std::function<void(const Channel&)>& body) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) throw std::runtime_error("socketpair");
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      ::close(fds[0]);
      int code = 0;
      try {
        body(Channel(fds[1]));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "peer process failed: %s\n", e.what());
        code = 1;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~PeerProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait_exit();
    }
    if (fd_ >= 0) ::close(fd_);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  Channel channel() const { return Channel(fd_); }
  pid_t pid() const { return pid_; }
  // The raw wait status.
  int wait_exit() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    wait_exit();
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
};

}  // namespace ferry::ucx_test
