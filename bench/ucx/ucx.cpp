// bench/ucx/ucx.cpp: `ferry bench ucx`: the UCX plugin between this process (sender) and a
// receiver process (this program run again), per UCX transport and bucket size, in host or GPU
// memory, through the plugin's C table exactly as the session protocol drives it (put + flush
// where the plugin allows put, else tagged buckets into posted receives; two buckets in flight as
// in a session, one from 512 MiB, or --slots), next
// to ucx_perftest on the same transport, memory type and sizes. The receiver's host buffer is
// memory the plugin allocates (ABI 1.7 alloc_memory), as a session receiver's slots are, unless
// --receiver-memory host.
#include "bench/common/ferry_program.hpp"
#include "bench/common/process_channel.hpp"
#include "bench/ucx/ucx.hpp"

#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_api.hpp"
#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ferry::bench {
namespace {

using Bytes = std::vector<std::uint8_t>;
constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::int64_t kOpTimeoutNs = 120'000'000'000;  // per bucket / per control message

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One benchmarked UCX transport: its UCX_TLS with host and with GPU buffers (cuda_copy moves
// the small and staged pieces of CUDA memory; cuda_ipc maps the peer's GPU memory), and whether
// the plugin runs with its default UCX peer error handling (else error_mode = none, which shared
// memory needs on UCX 1.13). ucx_perftest runs on the same UCX_TLS, without and (peer) with -e.
struct BenchTransport {
  const char* name;
  const char* host_tls;  // nullptr: GPU memory only
  const char* cuda_tls;  // nullptr: host memory only
  bool peer_errors;
};
constexpr BenchTransport kTransports[] = {
    {"tcp", "tcp", "tcp,cuda_copy", true},
    // tcp without UCX peer error handling (error_mode = none): the plugin against tag_bw on the
    // same footing, which shows what the error handling itself costs over tcp.
    {"tcp-none", "tcp", "tcp,cuda_copy", false},
    {"shm", "sm", "sm,cuda_copy", false},
    // The plugin's default options on one host: UCX's own transport choice ("": UCX_TLS unset)
    // and peer error handling; what a session without [transport.ucx] options gets.
    {"default", "", "", true},
    // What a GPU receiver on this host gets with UCX's own transport choice: cuda_ipc for the
    // bulk, tcp for control messages and wireup.
    {"cuda_ipc", nullptr, "cuda_ipc,cuda_copy,tcp", true},
};

const BenchTransport& bench_transport(const std::string& name, bool cuda) {
  for (const auto& t : kTransports) {
    if (name == t.name && (cuda ? t.cuda_tls : t.host_tls) != nullptr) return t;
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "ferry bench ucx: unknown transport '{}' for --device {} (cpu: tcp, shm, default; cuda: "
       "cuda_ipc, tcp, shm, default)",
       name, cuda ? "cuda" : "cpu");
}
std::string tls_of(const std::string& name, bool cuda) {
  const auto& t = bench_transport(name, cuda);
  return cuda ? t.cuda_tls : t.host_tls;
}

// The memory kinds the plugin moves (its caps; CUDA only where its UCX has CUDA support).
std::uint32_t supported_memory_kinds_of(const ferry_transport_api_t& api) {
  ferry_transport_caps_t caps{};
  caps.struct_size = sizeof caps;
  throw_if_error(api.get_caps(&caps), "ucx get_caps");
  return caps.memory_kinds;
}

// The plugin options of a benchmarked transport. `rma` is the plugin's rma option ("auto": let
// the plugin choose; "never": force tagged buckets). The strings live in `storage`.
std::vector<ferry_option_t> transport_options(const std::string& name, bool cuda, const char* rma,
                                              std::string& storage) {
  storage = tls_of(name, cuda);
  std::vector<ferry_option_t> options = {{"rma", rma}};
  if (!storage.empty()) options.push_back({"tls", storage.c_str()});
  if (!bench_transport(name, cuda).peer_errors) options.push_back({"error_mode", "none"});
  return options;
}

// 64-bit words of a pattern that depends on the slot, so a stale or shifted bucket shows.
std::uint64_t pattern_word(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t z = i + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 27);
}
void fill_pattern(std::uint8_t* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t w = 0; w < n / 8; ++w) {
    const std::uint64_t v = pattern_word(w, seed);
    std::memcpy(p + w * 8, &v, 8);
  }
  for (std::uint64_t b = n / 8 * 8; b < n; ++b) p[b] = static_cast<std::uint8_t>(b ^ seed);
}
bool matches_pattern(const std::uint8_t* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t w = 0; w < n / 8; ++w) {
    const std::uint64_t v = pattern_word(w, seed);
    if (std::memcmp(p + w * 8, &v, 8) != 0) return false;
  }
  for (std::uint64_t b = n / 8 * 8; b < n; ++b) {
    if (p[b] != static_cast<std::uint8_t>(b ^ seed)) return false;
  }
  return true;
}

#if FERRY_HAVE_CUDA
void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "ferry bench ucx: {}: {}", what, cudaGetErrorString(err));
  }
}
#endif

// The bench's bucket memory: page-aligned host memory that is not zero-filled lazily during the
// timed runs, or (cuda) device memory of GPU 0, filled and checked through a host copy.
class Buffer {
 public:
  Buffer(std::uint64_t n, bool cuda) : size(n), cuda_(cuda) {
    if (cuda_) {
#if FERRY_HAVE_CUDA
      void* p = nullptr;
      cuda_ok(cudaSetDevice(0), "cudaSetDevice(0)");
      cuda_ok(cudaMalloc(&p, std::max<std::uint64_t>(n, 8)), "cudaMalloc");
      data = static_cast<std::uint8_t*>(p);
      zero(0, n);
      return;
#else
      fail(FERRY_STATUS_UNIMPLEMENTED, "ferry bench ucx --device cuda: built without CUDA");
#endif
    }
    void* p = nullptr;
    if (posix_memalign(&p, 4096, std::max<std::uint64_t>(n, 8)) != 0) {
      fail(FERRY_STATUS_OUT_OF_MEMORY, "ferry bench ucx: cannot allocate {} bytes", n);
    }
    data = static_cast<std::uint8_t*>(p);
    std::memset(data, 0, n);
  }
  // Host memory someone else owns (the transport's, from alloc_memory): zeroed, never freed here.
  Buffer(void* borrowed, std::uint64_t n) : size(n), owned_(false) {
    data = static_cast<std::uint8_t*>(borrowed);
    std::memset(data, 0, n);
  }
  ~Buffer() {
    if (!owned_) return;
#if FERRY_HAVE_CUDA
    if (cuda_) {
      (void)cudaFree(data);
      return;
    }
#endif
    std::free(data);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  ferry_memory_kind_t kind() const { return cuda_ ? FERRY_MEMORY_CUDA : FERRY_MEMORY_HOST; }
  // The pattern of `seed` into [offset, offset + n).
  void fill(std::uint64_t offset, std::uint64_t n, std::uint64_t seed) {
    if (!cuda_) return fill_pattern(data + offset, n, seed);
    std::vector<std::uint8_t> host(n);
    fill_pattern(host.data(), n, seed);
    copy(data + offset, host.data(), n, true);
  }
  bool matches(std::uint64_t offset, std::uint64_t n, std::uint64_t seed) const {
    if (!cuda_) return matches_pattern(data + offset, n, seed);
    std::vector<std::uint8_t> host(n);
    copy(host.data(), data + offset, n, false);
    return matches_pattern(host.data(), n, seed);
  }
  void zero(std::uint64_t offset, std::uint64_t n) {
#if FERRY_HAVE_CUDA
    if (cuda_) {
      cuda_ok(cudaMemset(data + offset, 0, n), "cudaMemset");
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      return;
    }
#endif
    std::memset(data + offset, 0, n);
  }

  std::uint8_t* data = nullptr;
  std::uint64_t size = 0;

 private:
  static void copy(void* to, const void* from, std::uint64_t n, bool to_device) {
#if FERRY_HAVE_CUDA
    cuda_ok(cudaMemcpy(to, from, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
            "cudaMemcpy");
#else
    (void)to, (void)from, (void)n, (void)to_device;
#endif
  }
  bool cuda_ = false;
  bool owned_ = true;
};

// Commands and rendezvous bytes between this process and the forked receiver.
class Channel : public ProcessChannel {
 public:
  explicit Channel(int fd) : ProcessChannel(fd, "ferry bench ucx") {}
};

// One transport instance driven through the C table; every failure throws ferry::Error.
class Endpoint {
 public:
  Endpoint(const ferry_transport_api_t& api, ferry_role_t role, const std::string& transport,
           bool cuda, const char* rma = "auto")
      : api_(api) {
    std::string tls;
    auto options = transport_options(transport, cuda, rma, tls);
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = role;
    args.options = options.data();
    args.num_options = options.size();
    args.device = cuda ? 0 : -1;
    throw_if_error(api_.create(&args, &t_), "ucx create");
  }
  ~Endpoint() { close(); }
  // Closes the endpoint to the peer; the instance (its worker) lives on until close().
  void disconnect() {
    if (t_ != nullptr && peer_ != nullptr) api_.disconnect(t_, peer_);
    peer_ = nullptr;
  }
  // Disconnects, deregisters and destroys the instance (while the registered buffers still
  // exist).
  void close() {
    if (t_ == nullptr) return;
    disconnect();
    for (auto* m : memories_) api_.deregister_memory(t_, m);
    memories_.clear();
    api_.destroy(t_);
    t_ = nullptr;
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Bytes take(ferry_blob_t blob) {
    Bytes out(blob.data, blob.data + blob.size);
    if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
    return out;
  }
  void connect(const Channel& channel, const char* peer_name) {
    ferry_blob_t own{};
    throw_if_error(api_.get_address(t_, &own), "ucx get_address");
    channel.send(take(own));
    const Bytes remote = channel.receive();
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    blob.data = remote.data();
    blob.size = remote.size();
    ferry_connect_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    args.remote_addresses = &blob;
    args.num_remote = 1;
    args.group_size = 2;
    args.peer_name = peer_name;
    args.deadline_ns = now_ns() + kOpTimeoutNs;
    throw_if_error(api_.connect(t_, &args, &peer_), "ucx connect");
  }
  ferry_memory_t* reg(Buffer& buffer) {
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.base = buffer.data;
    desc.size = buffer.size;
    desc.kind = buffer.kind();
    desc.device = desc.kind == FERRY_MEMORY_CUDA ? 0 : -1;
    ferry_memory_t* m = nullptr;
    throw_if_error(api_.register_memory(t_, &desc, &m), "ucx register_memory");
    memories_.push_back(m);
    return m;
  }
  // `size` bytes of host memory the plugin allocates and registers (ABI 1.7), or nullptr where it
  // does not (no alloc_memory, or UNIMPLEMENTED).
  void* alloc(std::uint64_t size, ferry_memory_t** m) {
    *m = nullptr;
    if (api_.alloc_memory == nullptr) return nullptr;
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.size = size;
    desc.kind = FERRY_MEMORY_HOST;
    desc.device = -1;
    void* data = nullptr;
    ErrorPtr error(api_.alloc_memory(t_, &desc, &data, m));
    if (error && error_code(error.get()) == FERRY_STATUS_UNIMPLEMENTED) return nullptr;
    throw_if_error(error.release(), "ucx alloc_memory");
    memories_.push_back(*m);
    return data;
  }
  Bytes key(ferry_memory_t* m) {
    ferry_blob_t blob{};
    throw_if_error(api_.pack_key(t_, m, &blob), "ucx pack_key");
    return take(blob);
  }
  static ferry_bucket_io_t bucket(ferry_memory_t* m, std::uint64_t offset, std::uint64_t size,
                                  std::uint32_t index) {
    ferry_bucket_io_t b{};
    b.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
    b.data = {FERRY_STRUCT_SIZE(ferry_memory_range_t, size), m, offset, size};
    b.bucket_index = index;
    b.deadline_ns = now_ns() + kOpTimeoutNs;
    return b;
  }
  ferry_request_t* send(const ferry_bucket_io_t& b) {
    ferry_request_t* r = nullptr;
    throw_if_error(api_.send_bucket(t_, peer_, &b, &r), "ucx send_bucket");
    return r;
  }
  ferry_request_t* recv(const ferry_bucket_io_t& b) {
    ferry_request_t* r = nullptr;
    throw_if_error(api_.recv_bucket(t_, peer_, &b, &r), "ucx recv_bucket");
    return r;
  }
  // put of `size` bytes from local offset to remote offset; nullptr error = ok.
  ferry_error_t* put(ferry_memory_t* m, std::uint64_t offset, std::uint64_t size, const Bytes& key,
                     std::uint64_t remote_offset, ferry_request_t** out) {
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    blob.data = key.data();
    blob.size = key.size();
    ferry_put_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    args.local = {FERRY_STRUCT_SIZE(ferry_memory_range_t, size), m, offset, size};
    args.remote_key = &blob;
    args.remote_offset = remote_offset;
    args.deadline_ns = now_ns() + kOpTimeoutNs;
    return api_.put(t_, peer_, &args, out);
  }
  ferry_request_t* flush() {
    ferry_request_t* r = nullptr;
    throw_if_error(api_.flush(t_, peer_, now_ns() + kOpTimeoutNs, &r), "ucx flush");
    return r;
  }
  void finish(ferry_request_t* r) {
    if (r == nullptr) return;
    ferry_error_t* e = api_.request_wait(t_, r, now_ns() + kOpTimeoutNs);
    api_.request_free(t_, r);
    throw_if_error(e, "ucx request");
  }

 private:
  const ferry_transport_api_t& api_;
  ferry_transport_t* t_ = nullptr;
  ferry_peer_t* peer_ = nullptr;
  std::vector<ferry_memory_t*> memories_;
};

// Buckets in flight: a session's two staging slots, one from 512 MiB (the bench's buffers, not
// a session's choice), or --slots.
int slots_for(const UcxBenchOptions& o, std::uint64_t size) {
  if (o.slots > 0) return o.slots;
  return size >= 512 * kMiB ? 1 : 2;
}

int iterations_for(const UcxBenchOptions& o, std::uint64_t size) {
  const std::uint64_t n = (o.bytes_per_size + size - 1) / size;
  return static_cast<int>(std::clamp<std::uint64_t>(n, static_cast<std::uint64_t>(o.min_iterations),
                                                    static_cast<std::uint64_t>(o.max_iterations)));
}

constexpr const char* kReceiverEnv = "FERRY_BENCH_UCX_RECEIVER";

std::vector<std::uint64_t> bench_sizes(const UcxBenchOptions& o) {
  if (!o.sizes.empty()) return o.sizes;
  return {kMiB, 16 * kMiB, 256 * kMiB, 1024 * kMiB};
}

// The receiver process: answers the sender's commands until "quit". Exit status 0 when every
// bucket it checked was intact.
int receiver_main(const UcxBenchOptions& o, const ferry_transport_api_t& api,
                  const std::string& transport, int channel_fd) {
  Channel ch(channel_fd);
  const bool cuda = o.device == "cuda";
  try {
    std::uint64_t largest = 0;
    for (auto s : bench_sizes(o)) {
      largest = std::max(largest, s * static_cast<std::uint64_t>(slots_for(o, s)));
    }
    Endpoint ep(api, FERRY_ROLE_RECEIVER, transport, cuda);
    ep.connect(ch, "bench sender");
    ferry_memory_t* m = nullptr;
    void* allocated = cuda || o.receiver_memory == "host" ? nullptr : ep.alloc(largest, &m);
    std::unique_ptr<Buffer> owned = allocated != nullptr
                                        ? std::make_unique<Buffer>(allocated, largest)
                                        : std::make_unique<Buffer>(largest, cuda);
    Buffer& buffer = *owned;
    if (m == nullptr) m = ep.reg(buffer);
    ch.send(ep.key(m));
    ch.send(std::string(allocated != nullptr ? "transport" : cuda ? "cuda" : "host"));
    std::uint32_t next_index = 0;
    for (;;) {
      std::istringstream command(ch.receive_text());
      std::string verb;
      command >> verb;
      if (verb == "quit") {  // the sender has closed its endpoint; its worker still runs
        ep.close();
        ch.send(std::string("closed"));
        return 0;
      }
      std::uint64_t size = 0;
      int n = 0, slots = 0;
      command >> size >> n >> slots;
      if (verb == "tag") {
        // Keep `slots` receives posted: bucket k+slots lands while bucket k is "applied".
        const std::uint32_t base = next_index;
        next_index += static_cast<std::uint32_t>(n);
        std::vector<ferry_request_t*> posted(static_cast<std::size_t>(slots), nullptr);
        for (int k = 0; k < std::min(n, slots); ++k) {
          posted[k] = ep.recv(Endpoint::bucket(m, k * size, size, base + k));
        }
        ch.send(std::string("ready"));
        for (int k = 0; k < n; ++k) {
          const int slot = k % slots;
          ep.finish(posted[slot]);
          posted[slot] = nullptr;
          if (k + slots < n) {
            posted[slot] = ep.recv(Endpoint::bucket(m, slot * size, size, base + k + slots));
          }
        }
        ch.send(std::string("done"));
        const int last_slot = (n - 1) % slots;
        ch.send(std::string(buffer.matches(last_slot * size, size, last_slot) ? "intact"
                                                                                  : "corrupt"));
      } else if (verb == "verify") {
        // After puts: slot s must hold pattern s.
        bool ok = true;
        for (int s = 0; s < std::min(n, slots); ++s) ok = ok && buffer.matches(s * size, size, s);
        buffer.zero(0, std::min<std::uint64_t>(buffer.size, size * slots));
        ch.send(std::string(ok ? "intact" : "corrupt"));
      } else {
        fail(FERRY_STATUS_INTERNAL, "ferry bench ucx receiver: unknown command '{}'", verb);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry bench ucx receiver (%s): %s\n", transport.c_str(), e.what());
    return 1;
  }
}

struct Measurement {
  std::uint64_t size = 0;
  int iterations = 0;
  double seconds = 0;
  bool intact = false;
  double bytes_per_second() const {
    return seconds > 0 ? static_cast<double>(size) * iterations / seconds : 0;
  }
};

struct TransportRun {
  std::string receiver_memory;  // "transport" (alloc_memory), "host" or "cuda"
  std::string primitive;  // "put" or "tag"
  std::string why;        // the plugin's answer to the probe put
  std::vector<Measurement> results;
};

// This program's arguments, from /proc/self/cmdline (the receiver runs with the same ones).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t end = all.find('\0', start);
    args.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return args;
}

// Starts the receiver: this program again, same arguments, with kReceiverEnv naming its end of
// the channel and the transport.
pid_t start_receiver(const std::string& transport, int fd) {
  std::vector<std::string> args = own_arguments();
  if (args.empty()) fail(FERRY_STATUS_IO, "ferry bench ucx: cannot read /proc/self/cmdline");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string value = fmt::format("{} {}", fd, transport);
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) fail(FERRY_STATUS_IO, "ferry bench ucx: fork failed");
  if (child == 0) {
    setenv(kReceiverEnv, value.c_str(), 1);
    execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "ferry bench ucx: cannot run /proc/self/exe: %s\n", std::strerror(errno));
    _exit(127);
  }
  return child;
}

// This process is the sender; returns the measurements per size.
TransportRun run_ferry(const UcxBenchOptions& o, const ferry_transport_api_t& api,
                       const std::string& transport, const std::vector<std::uint64_t>& sizes) {
  int fds[2];
  // The sender's end is not inherited; the receiver's is (it is named in kReceiverEnv).
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0 || fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0) {
    fail(FERRY_STATUS_IO, "ferry bench ucx: socketpair failed");
  }
  const pid_t child = start_receiver(transport, fds[1]);
  close(fds[1]);
  Watchdog::set_child(child);
  struct Reaper {
    pid_t pid;
    int fd;
    ~Reaper() {
      close(fd);
      int status = 0;
      // The receiver leaves on "quit" or when the channel closes; give it a moment, then kill.
      for (int i = 0; i < 200; ++i) {
        if (waitpid(pid, &status, WNOHANG) == pid) return;
        usleep(10'000);
      }
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  } reaper{child, fds[0]};
  Channel ch(fds[0]);

  TransportRun run;
  std::uint64_t largest = 0;
  for (auto s : sizes) largest = std::max(largest, s * static_cast<std::uint64_t>(slots_for(o, s)));
  // --primitive auto lets the plugin decide, as the session does (rma = auto on the sender).
  const char* rma = o.primitive == "tag" ? "never" : o.primitive == "put" ? "always" : "auto";
  const bool cuda = o.device == "cuda";
  Endpoint ep(api, FERRY_ROLE_SENDER, transport, cuda, rma);
  ep.connect(ch, "bench receiver");
  const Bytes key = ch.receive();
  run.receiver_memory = ch.receive_text();
  Buffer buffer(largest, cuda);
  ferry_memory_t* m = ep.reg(buffer);

  // Ask the plugin: a one-byte put is accepted only where it does RMA natively (rma = auto).
  ferry_request_t* probe = nullptr;
  ErrorPtr refused(ep.put(m, 0, 1, key, 0, &probe));
  if (refused) {
    run.primitive = "tag";
    run.why = error_message(refused.get());
  } else {
    ep.finish(probe);
    ep.finish(ep.flush());
    run.primitive = "put";
    run.why = "RMA native on this transport";
  }

  std::uint32_t next_index = 0;  // bucket indices run on across sizes, as the receiver's do
  for (const std::uint64_t size : sizes) {
    const int slots = slots_for(o, size);
    const int n = iterations_for(o, size);
    for (int s = 0; s < slots; ++s) buffer.fill(s * size, size, s);
    Measurement best;
    // One untimed warm-up run (registration caches, page faults), then the timed one.
    for (int pass = 0; pass < 2; ++pass) {
      const int iterations = pass == 0 ? std::min(n, 2) : n;
      Measurement meas;
      meas.size = size;
      meas.iterations = iterations;
      if (run.primitive == "tag") {
        ch.send(fmt::format("tag {} {} {}", size, iterations, slots));
        if (ch.receive_text() != "ready") fail(FERRY_STATUS_INTERNAL, "bench protocol");
        const std::int64_t start = now_ns();
        std::vector<ferry_request_t*> inflight(static_cast<std::size_t>(slots), nullptr);
        for (int k = 0; k < iterations; ++k) {
          const int slot = k % slots;
          if (inflight[slot] != nullptr) ep.finish(inflight[slot]);
          inflight[slot] = ep.send(Endpoint::bucket(m, slot * size, size, next_index++));
        }
        for (auto* r : inflight) ep.finish(r);
        if (ch.receive_text() != "done") fail(FERRY_STATUS_INTERNAL, "bench protocol");
        meas.seconds = static_cast<double>(now_ns() - start) / 1e9;
        meas.intact = ch.receive_text() == "intact";
      } else {
        // Each bucket is put and flushed (visible at the receiver: what the session waits for
        // before a BucketReady); as with tagged buckets, `slots` buckets are in flight, a slot
        // reused once the flush after its previous put has completed.
        std::vector<ferry_request_t*> puts(static_cast<std::size_t>(slots), nullptr);
        std::vector<ferry_request_t*> flushes(static_cast<std::size_t>(slots), nullptr);
        const auto settle = [&](int slot) {
          ep.finish(puts[slot]);
          ep.finish(flushes[slot]);
          puts[slot] = flushes[slot] = nullptr;
        };
        const std::int64_t start = now_ns();
        for (int k = 0; k < iterations; ++k) {
          const int slot = k % slots;
          settle(slot);
          throw_if_error(ep.put(m, slot * size, size, key, slot * size, &puts[slot]), "ucx put");
          flushes[slot] = ep.flush();
        }
        for (int slot = 0; slot < slots; ++slot) settle(slot);
        meas.seconds = static_cast<double>(now_ns() - start) / 1e9;
        ch.send(fmt::format("verify {} {} {}", size, iterations, slots));
        meas.intact = ch.receive_text() == "intact";
      }
      if (pass == 1) best = meas;
    }
    std::printf("  %s %s %s x %d: %s/s%s\n", transport.c_str(), run.primitive.c_str(),
                binary_size(size).c_str(), best.iterations,
                decimal_bytes(best.bytes_per_second()).c_str(), best.intact ? "" : " (CORRUPT)");
    std::fflush(stdout);
    run.results.push_back(best);
  }
  // An orderly end: each side closes its endpoint while the other's worker still runs (closing
  // towards a worker that is gone makes UCX log "error during flush" over tcp), this one first.
  ep.disconnect();
  ch.send(std::string("quit"));
  if (ch.receive_text() != "closed") fail(FERRY_STATUS_INTERNAL, "bench protocol");
  ep.close();
  Watchdog::set_child(0);
  return run;
}

std::string ratio_text(std::optional<double> ratio) {
  return ratio ? fmt::format("{:.0f}%", *ratio * 100) : "-";
}

std::string rate(std::optional<double> bps) {
  return bps ? decimal_bytes(*bps) + "/s" : "-";
}

}  // namespace

std::string default_perftest() {
  if (const auto& ferry = ferry_program()) {
    const auto beside = ferry->parent_path() / "ucx_perftest";
    std::error_code ec;
    if (std::filesystem::is_regular_file(beside, ec)) return beside.string();
  }
  return "ucx_perftest";
}

std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (...) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "size '{}': expected a number with an optional KiB/MiB/GiB "
                                        "suffix", text);
  }
  std::string unit = text.substr(pos);
  std::uint64_t scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "K" || unit == "KiB" || unit == "k") {
    scale = 1ull << 10;
  } else if (unit == "M" || unit == "MiB") {
    scale = 1ull << 20;
  } else if (unit == "G" || unit == "GiB") {
    scale = 1ull << 30;
  } else {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "size '{}': unknown unit '{}' (KiB, MiB, GiB)", text, unit);
  }
  if (value == 0 || value > (64ull << 30) / scale) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "size '{}': must be from 1 byte to 64 GiB", text);
  }
  return value * scale;
}

int run_ucx_receiver_if_asked(const UcxBenchOptions& o, const ferry_transport_api_t& api) {
  const char* value = std::getenv(kReceiverEnv);
  if (value == nullptr) return -1;
  std::istringstream in(value);
  int fd = -1;
  std::string transport;
  if (!(in >> fd >> transport) || fd < 0) {
    std::fprintf(stderr, "ferry bench ucx: %s='%s': expected '<fd> <transport>'\n", kReceiverEnv,
                 value);
    return 2;
  }
  unsetenv(kReceiverEnv);
  const int code = receiver_main(o, api, transport, fd);
  close(fd);
  return code;
}

int run_ucx_bench(const UcxBenchOptions& o, const ferry_transport_api_t& api, Json& records) {
  const std::vector<std::uint64_t> sizes = bench_sizes(o);
  const bool cuda = o.device == "cuda";
  const std::string memory = cuda ? "cuda" : "host";
  std::vector<std::string> transports = o.transports;
  if (transports.empty()) {
    transports = cuda ? std::vector<std::string>{"cuda_ipc", "tcp"}
                      : std::vector<std::string>{"tcp", "shm", "default"};
  }
  for (const auto& t : transports) bench_transport(t, cuda);  // validates every name first
  if (cuda && (supported_memory_kinds_of(api) & FERRY_MEMORY_CUDA) == 0) {
    std::fprintf(stderr,
                 "ferry bench ucx --device cuda: the UCX plugin does not move CUDA memory here "
                 "(its UCX has no CUDA support, or no GPU is visible): build against a UCX with "
                 "CUDA (-Ducx_dir, e.g. pip install libucx-cu13)\n");
    return 3;
  }
  int code = 0;
  Table table({"transport", "memory", "bucket", "iters", "primitive", "ferry", "ucp_put_bw",
               "tag_bw", "tag_bw -e", "best baseline", "ratio", ">=70%"});
  for (const std::string& transport : transports) {
    const std::string tls = tls_of(transport, cuda);
    std::printf("ucx %s (UCX_TLS %s, %s memory): ferry through the plugin (sender here, receiver "
                "a second process)\n",
                transport.c_str(), tls.empty() ? "unset: UCX's choice" : tls.c_str(),
                memory.c_str());
    Watchdog::phase("pushing buckets through the UCX plugin");
    TransportRun run;
    try {
      run = run_ferry(o, api, transport, sizes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry bench ucx %s: %s\n", transport.c_str(), e.what());
      code = 1;
      continue;
    }
    std::printf("ucx %s: primitive %s (%s); receiver memory: %s\n", transport.c_str(),
                run.primitive.c_str(), run.why.c_str(),
                run.receiver_memory == "transport" ? "allocated by the plugin (alloc_memory)"
                                                   : run.receiver_memory.c_str());
    for (const Measurement& meas : run.results) {
      PerftestResult put, tag, tag_e;
      if (!o.no_perftest) {
        Watchdog::phase("running ucx_perftest");
        const int n = iterations_for(o, meas.size);
        // Over tcp UCX emulates RMA at ~45 MB/s: a put_bw baseline of large sizes would take
        // minutes and cannot be the best baseline there, so it is measured up to 16 MiB only.
        const bool over_tcp = transport == "tcp" || transport == "tcp-none";
        if (!over_tcp || meas.size <= 16 * kMiB) {
          put = run_perftest(o.perftest, tls, "ucp_put_bw", meas.size,
                             over_tcp ? std::min(n, 5) : n, o.perftest_timeout_s, memory);
        } else {
          put.error = "skipped: RMA is emulated over tcp (measured up to 16 MiB)";
        }
        tag = run_perftest(o.perftest, tls, "tag_bw", meas.size, n, o.perftest_timeout_s,
                           memory);
        if (bench_transport(transport, cuda).peer_errors) {
          tag_e = run_perftest(o.perftest, tls, "tag_bw", meas.size, n, o.perftest_timeout_s,
                               memory, true);
        } else {
          tag_e.error = "skipped: the plugin runs error_mode = none here";
        }
        for (const auto* r : {&put, &tag, &tag_e}) {
          if (!r->bytes_per_second && r->error.rfind("skipped", 0) != 0) {
            std::fprintf(stderr, "ucx_perftest %s %s: %s\n", transport.c_str(),
                         binary_size(meas.size).c_str(), r->error.c_str());
          }
        }
      }
      std::optional<double> best;
      std::string best_name;
      if (put.bytes_per_second) {
        best = put.bytes_per_second;
        best_name = "ucp_put_bw";
      }
      if (tag.bytes_per_second && (!best || *tag.bytes_per_second > *best)) {
        best = tag.bytes_per_second;
        best_name = "tag_bw";
      }
      const double ferry_bps = meas.bytes_per_second();
      std::optional<double> ratio;
      if (best && *best > 0) ratio = ferry_bps / *best;
      if (!meas.intact) code = 1;
      table.add_row({transport, memory, binary_size(meas.size), std::to_string(meas.iterations),
                     run.primitive, rate(ferry_bps) + (meas.intact ? "" : " CORRUPT"),
                     rate(put.bytes_per_second), rate(tag.bytes_per_second),
                     rate(tag_e.bytes_per_second),
                     best ? rate(best) + " (" + best_name + ")" : "-", ratio_text(ratio),
                     ratio ? (*ratio >= 0.7 ? "yes" : "no") : "-"});
      Json record = record_header("ucx", transport + "-" + memory + "-" + binary_size(meas.size),
                                  cuda ? Device::cuda : Device::cpu);
      record["transport"] = transport;
      record["ucx_tls"] = tls;
      record["memory"] = memory;
      record["bucket_bytes"] = meas.size;
      record["iterations"] = meas.iterations;
      record["primitive"] = run.primitive;
      record["primitive_reason"] = run.why;
      record["receiver_memory"] = run.receiver_memory;
      record["ferry_bytes_per_second"] = ferry_bps;
      record["ferry_seconds"] = meas.seconds;
      record["intact"] = meas.intact;
      record["perftest_ucp_put_bw_bytes_per_second"] =
          put.bytes_per_second ? Json(*put.bytes_per_second) : Json(nullptr);
      record["perftest_ucp_put_bw_note"] = put.error;
      record["perftest_tag_bw_bytes_per_second"] =
          tag.bytes_per_second ? Json(*tag.bytes_per_second) : Json(nullptr);
      record["perftest_tag_bw_note"] = tag.error;
      record["perftest_tag_bw_error_handling_bytes_per_second"] =
          tag_e.bytes_per_second ? Json(*tag_e.bytes_per_second) : Json(nullptr);
      record["perftest_tag_bw_error_handling_note"] = tag_e.error;
      record["best_baseline"] = best_name;
      record["ratio"] = ratio ? Json(*ratio) : Json(nullptr);
      record["target_ratio"] = 0.7;
      records.push_back(std::move(record));
    }
  }
  std::printf("\n");
  table.print();
  std::printf(
      "ferry: sender here -> receiver process through libferry_transport_ucx.so; baselines:\n"
      "ucx_perftest (MB/s read as 2^20 B/s) on the same UCX_TLS, memory type (-m) and\n"
      "sizes; ratio = ferry / best baseline (target >= 70%%). tcp, cuda_ipc and default:\n"
      "the plugin's default error_mode=peer; tag_bw -e: perftest with that same error\n"
      "handling (UCX gives up zero-copy over tcp with it); shm, tcp-none: error_mode=none;\n"
      "default: UCX_TLS unset, for the plugin and perftest alike.\n");
  return code;
}

}  // namespace ferry::bench
