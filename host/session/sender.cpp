// The trainer side: plans buckets once, then runs one session per receiver on its own thread
// (see session/sender.hpp and docs/session-protocol.md).
#include "session/sender.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <httplib.h>
#include <kj/exception.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>

#include <ferry/kernels/cuda.hpp>
#endif

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "common/log.hpp"
#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/channel.hpp"
#include "session/data_path.hpp"
#include "session/device_fingerprints.hpp"
#include "session/served_ports.hpp"
#include "session/transport_choice.hpp"

namespace ferry::session {
namespace {

// The fingerprint (docs/fingerprint.md) the receiver must report for a tensor; CUDA tensors are
// fingerprinted on their device.
std::uint64_t fingerprint_tensor(const TensorView& t, unsigned threads) {
  const std::uint64_t size = byte_size(t.dtype, t.shape).value_or(0);
  if (t.memory_kind != FERRY_MEMORY_CUDA) return kernels::fingerprint_cpu(t.data, size, threads);
#if FERRY_HAVE_CUDA
  if (const cudaError_t e = cudaSetDevice(t.device); e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "push: tensor '{}': CUDA device {}: {}", t.name, t.device,
         cudaGetErrorString(e));
  }
  return kernels::fingerprint_cuda(t.data, size, nullptr);
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "push: tensor '{}' is in CUDA memory (no CUDA in this build)",
       t.name);
#endif
}

// Fingerprints of every CUDA tensor, into `prints` at its index: per device, the kernels run
// side by side on a pool of streams with one read-back (session/device_fingerprints.hpp).
// Host tensors are left alone.
void fingerprint_device_tensors(std::span<const TensorView> tensors,
                                std::vector<std::uint64_t>& prints) {
  std::map<int, std::vector<std::size_t>> by_device;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].memory_kind == FERRY_MEMORY_CUDA) by_device[tensors[t].device].push_back(t);
  }
  for (const auto& [device, indices] : by_device) {
    std::vector<const void*> data;
    std::vector<std::uint64_t> bytes;
    data.reserve(indices.size());
    bytes.reserve(indices.size());
    for (std::size_t t : indices) {
      data.push_back(tensors[t].data);
      bytes.push_back(byte_size(tensors[t].dtype, tensors[t].shape).value_or(0));
    }
    const auto values = fingerprint_device_ranges(device, data, bytes, "push");
    for (std::size_t k = 0; k < indices.size(); ++k) prints[indices[k]] = values[k];
  }
}

// Packs one tensor into a host staging slot. CUDA tensors are staged through host memory (one
// device-to-host copy per tensor and receiver); the data transports then move host buckets.
void copy_to_host(std::byte* dst, const TensorView& t, std::uint64_t size) {
  if (size == 0) return;
  if (t.memory_kind != FERRY_MEMORY_CUDA) {
    std::memcpy(dst, t.data, size);
    return;
  }
#if FERRY_HAVE_CUDA
  cudaError_t e = cudaSetDevice(t.device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, t.data, size, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "push: copying tensor '{}' from CUDA device {} failed: {}", t.name,
         t.device, cudaGetErrorString(e));
  }
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "push: tensor '{}' is in CUDA memory (no CUDA in this build)",
       t.name);
#endif
}


constexpr std::uint32_t kSlots = 2;  // double buffering
// How long the sender polls for a Ready or a Committed before it sleeps on the socket: both
// come within ~0.1-0.5 ms of the request, and a wake-up adds tens of microseconds each.
constexpr std::chrono::microseconds kAnswerSpin{2000};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct HostPort {
  std::string host;
  int port = 0;
};

HostPort parse_address(const std::string& address) {
  HostPort hp;
  std::string port_text;
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' is not [HOST]:PORT", address);
    }
    hp.host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' is not HOST:PORT", address);
    }
    hp.host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  try {
    std::size_t used = 0;
    hp.port = std::stoi(port_text, &used);
    if (used != port_text.size() || hp.port <= 0 || hp.port > 65535) throw std::out_of_range("");
  } catch (const std::exception&) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' has no valid port", address);
  }
  return hp;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

struct PlannedBucket {
  std::vector<std::pair<std::size_t, std::uint64_t>> items;  // tensor index, offset in bucket
  std::uint64_t bytes = 0;
  std::vector<std::uint8_t> manifest;
  std::vector<std::uint64_t> fingerprints;  // per item
  bool cuda = true;  // every item is in CUDA memory (a device transport may put it in place)
};

struct PushPlan {
  // Fingerprints and manifests are computed while the sessions set up (handshake, connect,
  // first copies), once, by the first session that needs them (seal(); a session whose copies
  // fingerprint what they write needs none): each bucket's `fingerprints` and `manifest` may be
  // read only after wait_sealed(), which rethrows the fingerprinting's failure.
  std::function<void()> seal;  // starts the work unless started; any thread
  std::shared_future<void> sealed;
  void wait_sealed() const {
    seal();
    sealed.get();
  }
  std::vector<PlannedBucket> buckets;
  std::uint64_t capacity = 0;
  std::uint64_t total = 0;
  std::uint64_t bucket_total = 0;  // the buckets' bytes (alignment padding included)
  bool cuda_tensors = false;  // every tensor is in CUDA memory
  int device = -1;            // the GPU of the first CUDA tensor; -1: none
  std::vector<std::uint64_t> sizes;  // bytes of each tensor of the push
};

// The manifest of bucket `k`: its tensors at their offsets in the bucket, with `prints` (one
// per tensor of the push) as their fingerprints; none when `prints` is empty.
std::vector<std::uint8_t> bucket_manifest(const PushPlan& plan, std::uint32_t k,
                                          std::span<const TensorView> tensors,
                                          std::uint64_t version, const std::string& label,
                                          std::span<const std::uint64_t> prints) {
  const auto& b = plan.buckets[k];
  manifest::Manifest m;
  m.version = version;
  m.version_label = label;
  m.bucket_index = k;
  m.bucket_count = static_cast<std::uint32_t>(plan.buckets.size());
  m.bucket_bytes = b.bytes;
  m.tensors.reserve(b.items.size());
  for (const auto& [index, offset] : b.items) {
    const auto& t = tensors[index];
    manifest::Entry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.offset = offset;
    e.size = plan.sizes[index];
    if (!prints.empty()) e.fingerprint = prints[index];
    m.tensors.push_back(std::move(e));
  }
  return manifest::encode(m);
}


// A session kept after its commit for the next push to the same receiver (docs/
// session-protocol.md, "Kept sessions"): its handshake, its data path's connect and whatever
// that imported of the receiver's memory serve every later push of the same tensors. Between
// pushes a watcher thread answers the receiver: its Closing (it is about to release that
// memory) or its disconnect makes the watcher drop the data path, unmapping what it imported,
// and then close the connection, which the receiver waits for.
struct Link {
  std::unique_ptr<Channel> channel;
  std::unique_ptr<SenderDataPath> data;
  bool keep = false;    // the receiver keeps the session (Welcome.keepSession)
  bool direct = false;  // direct delivery was chosen in the handshake
  bool writer_prints = false;  // direct, and the copies fingerprint what they write
  bool prints_at_commit = false;  // the receiver takes those with the Commit (Welcome)
  std::vector<std::pair<std::uint32_t, std::uint64_t>> destinations;  // per tensor, direct
  // Set by the watcher, read after stop_watching(): the session is gone, and why.
  bool closed = false;
  std::string closed_why;

  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link() {
    stop_watching();
    data.reset();  // first: the receiver takes the disconnect as the sign it is done
    channel.reset();
  }

  // What the handshake was made for (the catalog: names, dtypes, shapes in order), and whether
  // a push fits it.
  void remember(std::span<const TensorView> tensors, const PushPlan& plan) {
    catalog_.clear();
    catalog_.reserve(tensors.size());
    for (const auto& t : tensors) catalog_.push_back({t.name, t.dtype, t.shape});
    capacity_ = plan.capacity;
    device_ = plan.device;
    cuda_tensors_ = plan.cuda_tensors;
  }
  // `catalog_same`: same_catalog(tensors), when the caller knows it already.
  bool fits(std::span<const TensorView> tensors, const PushPlan& plan,
            std::optional<bool> catalog_same = std::nullopt) const {
    return plan.capacity <= capacity_ && plan.device == device_ &&
           plan.cuda_tensors == cuda_tensors_ &&
           (catalog_same ? *catalog_same : same_catalog(tensors));  // (value_or would compare)
  }
  bool same_catalog(std::span<const TensorView> tensors) const {
    if (tensors.size() != catalog_.size()) return false;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      const auto& c = catalog_[i];
      if (t.dtype != c.dtype || t.name != c.name || t.shape != c.shape) return false;
    }
    return true;
  }

  // After a commit, before the session is kept: the data path lets go of the push's tensors.
  void forget_push() noexcept {
    if (data) data->end_push();
  }

  // Starts the watcher; false when no thread or eventfd could be had (then not kept).
  bool start_watching(const std::string& peer) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) return false;
    try {
      watcher_ = std::thread([this, peer] { watch(peer); });
    } catch (const std::system_error&) {
      ::close(wake_fd_);
      wake_fd_ = -1;
      return false;
    }
    return true;
  }

  // Tells the watcher to let go; stop_watching() joins it. A push asks first thing, so the
  // watcher's wake-up overlaps the push's checks.
  void ask_to_stop() noexcept {
    if (!watcher_.joinable() || stop_asked_) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
    stop_asked_ = true;
  }

  // The next push takes the session back (or it is destroyed).
  void stop_watching() noexcept {
    if (watcher_.joinable()) {
      ask_to_stop();
      watcher_.join();
    }
    stop_asked_ = false;
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
  }

 private:
  void watch(const std::string& peer) {
    pollfd fds[2] = {{channel->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    while (true) {
      const int n = ::poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || fds[1].revents != 0) return;  // taken back (or no way to wait)
      if (fds[0].revents != 0) break;
    }
    // The receiver spoke between pushes: its Closing, or its disconnect.
    closed_why = "the receiver disconnected";
    try {
      auto msg = channel->recv(deadline_in(std::chrono::milliseconds(1000)), "between pushes");
      if (msg->root().which() == wire::Message::CLOSING) {
        closed_why = fmt::format("the receiver closed it: {}",
                                 text(msg->root().getClosing().getReason()));
      } else {
        closed_why = "the receiver sent an unexpected message between pushes";
      }
    } catch (const std::exception& e) {
      closed_why = e.what();
    }
    const auto start = Clock::now();
    data.reset();
    channel.reset();
    closed = true;
    logger("sender")->info("{}: kept session ended ({}); dropped in {:.3f} ms", peer, closed_why,
                           seconds_since(start) * 1e3);
  }

  struct Described {
    std::string name;
    ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
    std::vector<std::uint64_t> shape;
  };
  std::vector<Described> catalog_;
  std::uint64_t capacity_ = 0;
  int device_ = -1;
  bool cuda_tensors_ = false;
  std::thread watcher_;
  int wake_fd_ = -1;
  bool stop_asked_ = false;
};

const char* delivery_name(config::Delivery d) {
  switch (d) {
    case config::Delivery::direct: return "direct";
    case config::Delivery::staged: return "staged";
    case config::Delivery::automatic: break;
  }
  return "auto";
}

}  // namespace

bool PushReport::all_committed() const {
  if (receivers.empty()) return false;
  for (const auto& r : receivers) {
    if (!r.committed) return false;
  }
  return true;
}

struct Sender::Impl {
  config::Config config;
  const registry::Registry& registry;
  SenderOptions options;

  mutable std::mutex mutex;  // guards results, channels, data paths, abort state
  std::vector<ReceiverResult> results;
  std::set<Channel*> channels;
  std::set<SenderDataPath*> data_paths;
  bool running = false;
  bool aborted = false;
  std::string abort_reason;

  // A push's data paths and channels go away after it returns (deregistrations, disconnect,
  // unmapping the receiver's memory: ~2 ms that are not part of the update); the next push, and
  // the Sender's destruction, wait for them first, so nothing accumulates.
  std::mutex teardown_mutex;
  std::vector<std::thread> teardowns;
  void wait_teardowns() noexcept {
    std::vector<std::thread> pending;
    {
      std::lock_guard lock(teardown_mutex);
      pending.swap(teardowns);
    }
    for (auto& t : pending) t.join();
  }
  // Per receiver (SenderOptions::receivers order): the session kept from the last push, or
  // null. Only that receiver's push thread touches its entry.
  std::vector<std::unique_ptr<Link>> links;

  ~Impl() {
    links.clear();  // closes the kept sessions
    wait_teardowns();
  }

  Impl(const config::Config& c, const registry::Registry& r, SenderOptions o)
      : config(c), registry(r), options(std::move(o)), links(options.receivers.size()) {}

  // The data transport for one receiver (session/transport_choice.hpp): "inline" or a plugin
  // name, `required` false when "auto" chose it. Throws INCOMPATIBLE for a same-node-only
  // transport and a receiver on another host.
  TransportChoice choose_transport(const std::string& address, bool cuda_tensors) const {
    TransportQuery q;
    q.requested = options.transport.empty() ? config.update.transport : options.transport;
    q.preference = config.update.transport_preference;
    q.receiver = address;
    const HostPort where = parse_address(address);
    q.receiver_on_this_host = is_this_host(where.host);
    q.receiver_in_this_process =
        q.receiver_on_this_host && served_in_this_process(where.port);
    q.cuda_tensors = cuda_tensors;
    auto choice = session::choose_transport(q, [&](const std::string& name) {
      TransportFacts f;
      try {
        auto plugin = registry.transport(name);
        f.loadable = true;
        if (const auto& caps = plugin->info().transport_caps) {
          f.flags = caps->flags;
          f.memory_kinds = caps->memory_kinds;
        }
      } catch (const Error& e) {
        f.error = e.what();
      }
      return f;
    });
    logger("sender")->info("receiver {}: transport {}", address, choice.why);
    return choice;
  }

  // Both the options and the configuration (update.keep_sessions) allow it.
  bool keep_sessions() const { return options.keep_sessions && config.update.keep_sessions; }

  void set_result(std::size_t i, const ReceiverResult& r) {
    std::lock_guard lock(mutex);
    results[i] = r;
  }

  bool is_aborted(std::string& reason) const {
    std::lock_guard lock(mutex);
    reason = abort_reason;
    return aborted;
  }

  // One push to receiver `index`: through the session kept from the previous push when it fits
  // (same tensors, bucket capacity and memory) and is still open, else through a new one. A
  // kept session that turns out closed before its update began (the receiver released its
  // memory, restarted, or stopped) is replaced by a new session within the same push.
  // `catalog_same`: whether the tensors are the kept session's catalog, where push() compared.
  void run_receiver(std::size_t index, std::span<const TensorView> tensors, const PushPlan& plan,
                    std::uint64_t version, const std::string& label,
                    std::optional<bool> catalog_same) {
    const std::string address = options.receivers[index];
    ReceiverResult result;
    result.address = address;
    const auto start = Clock::now();
    auto update_start = start;
    auto update_end = start;
    std::unique_ptr<Link> link = std::move(links[index]);
    if (link) {
      link->stop_watching();
      std::string why;
      if (link->closed) {
        why = link->closed_why;
      } else if (!link->fits(tensors, plan, catalog_same)) {
        why = "another set of tensors, bucket capacity or device";
      }
      if (!why.empty()) {
        logger("sender")->debug("{}: kept session not used ({})", address, why);
        retire(std::move(link));
      }
    }
    // abort() reaches the link's channel and data path while it is registered.
    auto track = [&](bool on) {
      if (!link) return;
      std::lock_guard lock(mutex);
      if (on) {
        if (link->channel) channels.insert(link->channel.get());
        if (link->data) data_paths.insert(link->data.get());
      } else {
        channels.erase(link->channel.get());
        data_paths.erase(link->data.get());
      }
    };
    try {
      bool done = false;
      if (link) {
        track(true);
        bool began = false;
        try {
          {
            std::lock_guard lock(mutex);
            if (aborted) fail(FERRY_STATUS_ABORTED, "aborted: {}", abort_reason);
          }
          result.reused_session = true;
          update_start = Clock::now();
          update(*link, index, tensors, plan, version, label, result, began);
          update_end = Clock::now();
          done = true;
        } catch (const Error& e) {
          std::string reason;
          if (began || is_aborted(reason)) throw;
          // Nothing of this update was written: a new session takes over.
          logger("sender")->info("{}: kept session closed ({}); opening a new one", address,
                                 e.what());
          track(false);
          retire(std::move(link));
          result = ReceiverResult{};
          result.address = address;
        }
      }
      if (!done) {
        link = std::make_unique<Link>();
        const TransportChoice transport = choose_transport(address, plan.cuda_tensors);
        link->channel = open_channel(address);
        track(true);
        {
          std::lock_guard lock(mutex);
          if (aborted) fail(FERRY_STATUS_ABORTED, "aborted: {}", abort_reason);
        }
        open_link(*link, index, tensors, plan, transport);
        track(true);  // the data path, created by open_link
        bool began = false;
        update_start = Clock::now();
        update(*link, index, tensors, plan, version, label, result, began);
        update_end = Clock::now();
      }
      result.committed = true;
    } catch (const Error& e) {
      std::string reason;
      result.code = e.code();
      if (is_aborted(reason) && e.code() != FERRY_STATUS_CORRUPT_DATA) {
        result.code = FERRY_STATUS_ABORTED;
        result.error = fmt::format("receiver {}: aborted: {}", address, reason);
      } else {
        result.error = e.what();
        if (result.error.find(address) == std::string::npos) {
          result.error = fmt::format("receiver {}: {}", address, result.error);
        }
      }
      if (link && link->channel && !link->channel->is_shut_down()) {
        try {
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Message>().initAbort().setReason(result.error);
          link->channel->send(m, deadline_in(std::chrono::milliseconds(1000)), "abort");
        } catch (...) {
        }
      }
    } catch (const kj::Exception& e) {
      result.code = FERRY_STATUS_CORRUPT_DATA;
      result.error = fmt::format("receiver {}: malformed session message ({})", address,
                                 e.getDescription().cStr());
    } catch (const std::exception& e) {
      result.code = FERRY_STATUS_INTERNAL;
      result.error = fmt::format("receiver {}: {}", address, e.what());
    }
    track(false);
    if (link && result.committed && link->keep && keep_sessions()) {
      // Kept for the next push; meanwhile its watcher answers the receiver.
      link->forget_push();
      if (link->start_watching(address)) {
        links[index] = std::move(link);
      }
    }
    // Not kept: the plugin instance and the channel go on a thread of their own
    // (wait_teardowns()); the receiver has committed or failed by now.
    if (link) retire(std::move(link));
    result.seconds = seconds_since(start);
    if (!result.committed) logger("sender")->warn("{}", result.error);
    if (result.committed) {
      const auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      logger("sender")->debug("{}: {:.3f} ms before the update ({}), {:.3f} ms after it",
                              address, ms(start, update_start),
                              result.reused_session ? "kept session" : "new session",
                              ms(update_end, Clock::now()));
    }
    set_result(index, result);
  }

  // Destroys a session that is not kept (unregistrations, disconnect, unmapping the receiver's
  // memory: ~2 ms that are not part of any update) on a thread of its own.
  void retire(std::unique_ptr<Link> link) {
    auto teardown = [link = std::move(link)]() mutable {
      if (!link) return;  // moved into a thread that could not be started, and destroyed there
      const auto teardown_start = Clock::now();
      const std::string peer = link->channel ? link->channel->peer() : std::string("receiver");
      link.reset();
      logger("sender")->debug("{}: data path and channel teardown {:.3f} ms", peer,
                              seconds_since(teardown_start) * 1e3);
    };
    std::lock_guard lock(teardown_mutex);
    try {
      teardowns.emplace_back(std::move(teardown));
    } catch (const std::system_error&) {
      teardown();  // no thread to be had: here
    }
  }

  std::unique_ptr<Channel> open_channel(const std::string& address) {
    const HostPort hp = parse_address(address);
    const std::string who = "receiver " + address;
    httplib::Client client(hp.host, hp.port);
    const auto ms = options.connect_timeout.count();
    client.set_connection_timeout(std::chrono::milliseconds(ms));
    client.set_read_timeout(std::chrono::milliseconds(ms));
    client.set_write_timeout(std::chrono::milliseconds(ms));
    httplib::Headers headers;
    if (!options.token.empty()) headers.emplace("Authorization", "Bearer " + options.token);
    auto res = client.Get("/ferry/session", headers);
    if (!res) {
      fail(FERRY_STATUS_PEER_FAILED, "{}: discovery: GET /ferry/session failed ({})", who,
           httplib::to_string(res.error()));
    }
    if (res->status != 200) {
      fail(FERRY_STATUS_PEER_FAILED, "{}: discovery: GET /ferry/session answered {}: {}", who,
           res->status, res->body.substr(0, 300));
    }
    auto info = nlohmann::json::parse(res->body, nullptr, false);
    if (info.is_discarded() || !info.is_object() || !info.contains("port") ||
        !info["port"].is_number_integer()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: discovery: GET /ferry/session gave no session port",
           who);
    }
    const int port = info["port"].get<int>();
    const std::string unix_path =
        info.contains("unix_path") && info["unix_path"].is_string() ? info["unix_path"].get<std::string>() : "";
    const auto deadline = deadline_in(options.connect_timeout);
    if (!unix_path.empty() && is_loopback(hp.host) && std::filesystem::exists(unix_path)) {
      try {
        return std::make_unique<Channel>(connect_unix(unix_path, deadline, who), who);
      } catch (const Error& e) {
        logger("sender")->debug("{}: Unix socket failed ({}); using TCP", who, e.what());
      }
    }
    return std::make_unique<Channel>(connect_tcp(hp.host, port, deadline, who + " session"), who);
  }

  // Waits for the Ack of bucket `index`; checks its fingerprints.
  // Direct delivery: the Ack carries no fingerprints (the receiver verifies what was written in
  // place at commit, against the manifests' fingerprints).
  void wait_ack(Channel& ch, std::uint32_t index, const PushPlan& plan,
                std::span<const TensorView> tensors, bool direct) {
    const std::string phase = fmt::format("bucket {} (ack)", index);
    auto msg = ch.recv(deadline_in(options.bucket_timeout), phase);
    auto root = msg->root();
    if (root.which() == wire::Message::REFUSAL) {
      auto r = root.getRefusal();
      fail(static_cast<ferry_status_code_t>(r.getCode()), "{}: refused during {}: {}", ch.peer(),
           phase, text(r.getMessage()));
    }
    if (root.which() != wire::Message::ACK) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected message", ch.peer(), phase);
    }
    auto ack = root.getAck();
    if (ack.getIndex() != index) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: got the ack of bucket {}", ch.peer(), phase,
           ack.getIndex());
    }
    auto prints = ack.getFingerprints();
    if (direct && prints.size() == 0) return;
    plan.wait_sealed();
    const auto& b = plan.buckets[index];
    if (prints.size() != b.fingerprints.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: {} fingerprints for {} tensors", ch.peer(), phase,
           prints.size(), b.fingerprints.size());
    }
    for (unsigned i = 0; i < prints.size(); ++i) {
      if (prints[i] != b.fingerprints[i]) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: {}: tensor '{}' arrived with fingerprint {:016x}, sent {:016x}", ch.peer(),
             phase, tensors[b.items[i].first].name, prints[i], b.fingerprints[i]);
      }
    }
  }

  // Direct delivery when the receiver offered it (a destination per tensor), the configuration
  // allows it and every tensor is in CUDA memory the data path puts from. Fills `destinations`.
  bool choose_direct(wire::Welcome::Reader w, SenderDataPath& data, const PushPlan& plan,
                     std::size_t tensor_count, const std::string& peer,
                     std::vector<std::pair<std::uint32_t, std::uint64_t>>& destinations) const {
    if (config.update.delivery == config::Delivery::staged || !w.hasDestinations() ||
        w.getDestinations().size() != tensor_count || !plan.cuda_tensors ||
        !data.delivers_pieces(FERRY_MEMORY_CUDA)) {
      return false;
    }
    std::vector<std::vector<std::uint8_t>> keys;
    for (auto k : w.getRegions()) keys.emplace_back(k.begin(), k.end());
    destinations.clear();
    for (auto d : w.getDestinations()) {
      if (d.getRegion() >= keys.size()) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: welcome: destination in region {} of {}", peer,
             d.getRegion(), keys.size());
      }
      destinations.emplace_back(d.getRegion(), d.getOffset());
    }
    data.set_regions(std::move(keys));
    logger("sender")->info("{}: direct delivery: tensors go straight into the receiver's "
                           "parameters ({} shared regions)",
                           peer, w.getRegions().size());
    return true;
  }

  // Opens a session on `link`'s channel: the data path and the handshake (link's members are
  // owned by the caller, so that abort() never sees a freed one).
  void open_link(Link& link, std::size_t index, std::span<const TensorView> tensors,
                 const PushPlan& plan, const TransportChoice& transport) {
    const std::string& address = options.receivers[index];
    Channel& ch = *link.channel;
    auto& data = link.data;
    const auto session_start = Clock::now();
    bool direct = false;  // direct delivery (the Welcome offered it and it was chosen)
    auto& destinations = link.destinations;  // per tensor, direct
    if (transport.name != "inline") {
      try {
        data = make_plugin_sender_path(registry, config, transport.name, plan.capacity, kSlots,
                                       plan.device);
      } catch (const Error& e) {
        if (transport.required) throw;
        logger("sender")->warn("transport '{}' unavailable ({}); using inline", transport.name,
                               e.what());
      }
    }
    {
      std::lock_guard lock(mutex);
      if (data) data_paths.insert(data.get());
    }
    // Direct delivery through a transport whose copies fingerprint what they write needs no
    // separate pass over the tensors; anything else needs the plan's fingerprints.
    if (!data || !data->fingerprints_pieces() || !plan.cuda_tensors ||
        config.update.delivery == config::Delivery::staged) {
      plan.seal();
    }
    bool writer_prints = false;  // direct, and the copies fingerprint what they write
    const double create_s = seconds_since(session_start);
    double connect_s = 0;  // the data path's connect, inside the handshake
    // ---- handshake
    {
      capnp::MallocMessageBuilder m;
      auto hello = m.initRoot<wire::Message>().initHello();
      hello.setProtocolVersion(wire::PROTOCOL_VERSION);
      if (const char* v = std::getenv("FERRY_SESSION_TEST_PROTOCOL_VERSION")) {
        hello.setProtocolVersion(static_cast<std::uint32_t>(std::stoul(v)));
      }
      hello.setToken(options.token);
      char host[256] = "?";
      ::gethostname(host, sizeof host - 1);
      hello.setSenderName(fmt::format("{} pid {}", host, ::getpid()));
      auto list = hello.initTensors(static_cast<unsigned>(tensors.size()));
      for (unsigned i = 0; i < tensors.size(); ++i) {
        list[i].setName(tensors[i].name);
        list[i].setDtype(static_cast<std::uint32_t>(tensors[i].dtype));
        auto shape = list[i].initShape(static_cast<unsigned>(tensors[i].shape.size()));
        for (unsigned d = 0; d < tensors[i].shape.size(); ++d) shape.set(d, tensors[i].shape[d]);
      }
      hello.setConfigJson(options.config_json);
      hello.setTransport(data ? transport.name : std::string("inline"));
      hello.setTransportRequired(transport.required);
      const auto addr = data ? data->address() : std::vector<std::uint8_t>{};
      hello.setTransportAddress(kj::arrayPtr(addr.data(), addr.size()));
      hello.setBucketBytes(plan.capacity);
      hello.setSlots(kSlots);
      hello.setDelivery(delivery_name(config.update.delivery));
      hello.setKeepSession(keep_sessions());
      ch.send(m, deadline_in(options.connect_timeout), "handshake (hello)");
    }
    {
      const std::string phase = "handshake (welcome)";
      auto msg = ch.recv(deadline_in(options.connect_timeout), phase);
      auto root = msg->root();
      if (root.which() == wire::Message::REFUSAL) {
        auto r = root.getRefusal();
        fail(static_cast<ferry_status_code_t>(r.getCode()), "receiver {} refused the session: {}",
             address, text(r.getMessage()));
      }
      if (root.which() != wire::Message::WELCOME) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected message", ch.peer(), phase);
      }
      auto w = root.getWelcome();
      const std::string chosen = text(w.getTransport());
      if (chosen == "inline") {
        if (data) {
          logger("sender")->warn("receiver {} has no '{}'; using inline", address,
                                 transport.name);
          std::lock_guard lock(mutex);
          data_paths.erase(data.get());
        }
        auto replacement = make_inline_sender_path(plan.capacity, kSlots);
        data.swap(replacement);
      } else {
        if (!data || chosen != data->name()) {
          fail(FERRY_STATUS_INCOMPATIBLE, "{}: the receiver chose transport '{}'", ch.peer(),
               chosen);
        }
        std::vector<std::vector<std::uint8_t>> keys;
        for (auto s : w.getSlots()) {
          keys.emplace_back(s.getRemoteKey().begin(), s.getRemoteKey().end());
          if (s.getCapacity() < plan.capacity) {
            fail(FERRY_STATUS_INCOMPATIBLE, "{}: slot of {} bytes, need {}", ch.peer(),
                 s.getCapacity(), plan.capacity);
          }
        }
        const auto connect_start = Clock::now();
        data->connect(std::span<const std::uint8_t>(w.getTransportAddress().begin(),
                                                    w.getTransportAddress().size()),
                      keys, w.getRmaNative(), ch.peer(), deadline_in(options.connect_timeout));
        connect_s = seconds_since(connect_start);
        direct = choose_direct(w, *data, plan, tensors.size(), ch.peer(), destinations);
      }
      writer_prints = direct && data->fingerprints_pieces();
      if (!writer_prints) plan.seal();
      link.keep = w.getKeepSession();
      link.prints_at_commit = w.getFingerprintsAtCommit();
      if (!direct && config.update.delivery == config::Delivery::direct) {
        fail(FERRY_STATUS_INCOMPATIBLE,
             "{}: update.delivery is \"direct\", but the receiver offers no direct delivery over "
             "'{}' (it needs CUDA tensors, a transport that writes device memory such as "
             "cuda_ipc, and a pure-copy plan for every tensor; see the receiver's log)",
             ch.peer(), data->name());
      }
      std::lock_guard lock(mutex);
      data_paths.insert(data.get());
    }
    link.direct = direct;
    link.writer_prints = writer_prints;
    link.remember(tensors, plan);
    logger("sender")->debug("{}: session opened: data path {:.3f} ms, handshake {:.3f} ms "
                            "(connect {:.3f} ms)",
                            address, create_s * 1e3,
                            (seconds_since(session_start) - create_s) * 1e3, connect_s * 1e3);
  }

  // One update over an open session: begin, buckets, commit. `began` turns true once the
  // receiver is Ready (from then on a failure is this update's, not the session's).
  void update(Link& link, std::size_t index, std::span<const TensorView> tensors,
              const PushPlan& plan, std::uint64_t version, const std::string& label,
              ReceiverResult& result, bool& began) {
    const std::string& address = options.receivers[index];
    Channel& ch = *link.channel;
    SenderDataPath* data = link.data.get();
    const bool direct = link.direct;
    const bool writer_prints = link.writer_prints;
    // The copies' fingerprints go with the Commit, and each bucket is announced as soon as its
    // copies are queued (Begin.fingerprintsAtCommit): the receiver records it while the copies
    // run, and only the Commit waits for them.
    const bool prints_at_commit = writer_prints && link.prints_at_commit;
    const auto& destinations = link.destinations;
    // Phase timings for --log-level debug (where a push spends its time, per receiver).
    const auto session_start = Clock::now();
    double setup_s = 0;    // begin
    double deliver_s = 0;  // puts + flush (or packing + deliver) of every bucket
    double ack_s = 0;      // waiting for acks (the receiver's apply and checks)
    double announce_s = 0;  // the buckets' announcements (manifests made and sent)
    std::vector<std::uint64_t> session_prints;  // per tensor, from the copies (writer_prints)
    if (writer_prints) {
      session_prints.assign(tensors.size(), 0);
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        // An empty tensor is no copy: its fingerprint is that of nothing.
        if (plan.sizes[t] == 0) {
          session_prints[t] = kernels::fingerprint_cpu(nullptr, 0, 1);
        }
      }
    } else {
      plan.seal();
    }
    result.transport = data->name();
    result.direct = direct;
    result.writer_fingerprints = writer_prints;
    {
      std::lock_guard lock(mutex);
      results[index].transport = data->name();
    }
    // The pieces of bucket k for a device transport: each tensor from its own memory into the
    // receiver's slot, or (direct) straight into its destination in the receiver's parameters.
    auto pieces_of = [&](const PlannedBucket& b) {
      std::vector<TensorPiece> pieces;
      pieces.reserve(b.items.size());
      for (const auto& [t, offset] : b.items) {
        TensorPiece p;
        p.data = tensors[t].data;
        p.size = plan.sizes[t];
        p.offset = offset;
        p.kind = tensors[t].memory_kind;
        p.device = tensors[t].device;
        if (direct) {
          p.region = destinations[t].first;
          p.offset = destinations[t].second;
        }
        if (writer_prints) p.fingerprint = &session_prints[t];
        pieces.push_back(p);
      }
      return pieces;
    };
    // Direct delivery copies in groups: one bucket, or, where the copies fingerprint what they
    // write, consecutive buckets of at least SenderOptions::fingerprinted_group_bytes (the
    // fingerprinting kernel needs thousands of 1 MiB chunks per launch to fill the GPU).
    const auto count = static_cast<std::uint32_t>(plan.buckets.size());
    std::vector<std::pair<std::uint32_t, std::uint32_t>> groups;  // [first, end) buckets
    for (std::uint32_t k = 0; direct && k < count;) {
      std::uint32_t end = k + 1;
      std::uint64_t bytes = plan.buckets[k].bytes;
      while (writer_prints && end < count && bytes < options.fingerprinted_group_bytes) {
        bytes += plan.buckets[end++].bytes;
      }
      groups.emplace_back(k, end);
      k = end;
    }
    auto group_name = [&](std::size_t g) {
      const auto [first, end] = groups[g];
      return end - first == 1 ? fmt::format("bucket {}", first)
                              : fmt::format("buckets {}..{}", first, end - 1);
    };
    // Queues group g's copies (at most two groups started and not finished); with `launch`
    // false they wait for data->launch_pieces().
    auto start_group = [&](std::size_t g, Clock::time_point deadline, bool launch = true) {
      const auto deliver_start = Clock::now();
      std::vector<TensorPiece> pieces;
      for (std::uint32_t k = groups[g].first; k < groups[g].second; ++k) {
        auto more = pieces_of(plan.buckets[k]);
        pieces.insert(pieces.end(), more.begin(), more.end());
      }
      data->start_pieces(static_cast<std::uint32_t>(g % kSlots), groups[g].first,
                         std::move(pieces), deadline, group_name(g), launch);
      deliver_s += seconds_since(deliver_start);
    };
    // Where the transport's puts write nothing before their flush, the first two groups' copies
    // are queued while the receiver begins (its Begin -> Ready round trip, ~0.4 ms) and launched
    // once it is Ready. A flush issues every put queued before it, so both go as one launch of
    // twice the chunks, and the third group's launch runs beside it from the start (cuda_ipc's
    // copy lanes). Measured on an H200 (docs/benchmarks.md, session 7): 0.74 of the copy
    // ceiling at 4096 tensors and 0.77 at 256, against 0.70-0.73 and 0.81-0.85 with one group
    // queued early; the worse of the two counts is what the target bounds. Nothing is written
    // before the Ready; a refusal drops the session, and the queued copies with it.
    const std::size_t queued_early =
        data->defers_pieces() ? std::min<std::size_t>(groups.size(), 2) : 0;
    const bool queue_first_early = queued_early > 0;
    // ---- begin
    {
      capnp::MallocMessageBuilder m;
      auto b = m.initRoot<wire::Message>().initBegin();
      b.setVersion(version);
      b.setLabel(label);
      b.setBucketCount(static_cast<std::uint32_t>(plan.buckets.size()));
      b.setTotalBytes(plan.total);
      b.setViaPut(data->uses_put());
      b.setDirect(direct);
      b.setWriterFingerprints(writer_prints);
      b.setFingerprintsAtCommit(prints_at_commit);
      ch.send(m, deadline_in(options.bucket_timeout), "begin");
      for (std::size_t g = 0; g < queued_early; ++g) {
        start_group(g, deadline_in(options.bucket_timeout), false);
      }
      auto msg = ch.recv(deadline_in(options.bucket_timeout), "begin (ready)", kAnswerSpin);
      auto root = msg->root();
      if (root.which() == wire::Message::REFUSAL) {
        auto r = root.getRefusal();
        fail(static_cast<ferry_status_code_t>(r.getCode()), "{}: refused begin: {}", ch.peer(),
             text(r.getMessage()));
      }
      if (root.which() == wire::Message::CLOSING) {
        fail(FERRY_STATUS_PEER_FAILED, "{}: begin: the receiver closed the session ({})",
             ch.peer(), text(root.getClosing().getReason()));
      }
      if (root.which() != wire::Message::READY) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: begin: unexpected message", ch.peer());
      }
    }
    began = true;
    for (std::size_t g = 0; g < queued_early; ++g) {
      data->launch_pieces(deadline_in(options.bucket_timeout), group_name(g));
    }
    setup_s = seconds_since(session_start);
    // ---- buckets: slot k % kSlots is reused only after the ack of bucket k - kSlots
    std::uint32_t acked = 0;
    // Announces bucket k: its bytes are in place, or (prints_at_commit) its copies are queued.
    auto announce = [&](std::uint32_t k, Clock::time_point deadline) {
      const auto announce_start = Clock::now();
      const std::string phase = fmt::format("bucket {}", k);
      const std::uint32_t slot = k % kSlots;
      const auto& b = plan.buckets[k];
      capnp::MallocMessageBuilder m;
      auto br = m.initRoot<wire::Message>().initBucket();
      br.setIndex(k);
      br.setSlot(slot);
      br.setBytes(b.bytes);
      if (prints_at_commit) {
        const auto manifest = bucket_manifest(plan, k, tensors, version, label, {});
        br.setManifest(kj::arrayPtr(manifest.data(), manifest.size()));
      } else if (writer_prints) {
        // The fingerprints of bucket k's copies are in: its manifest carries them.
        const auto manifest = bucket_manifest(plan, k, tensors, version, label, session_prints);
        br.setManifest(kj::arrayPtr(manifest.data(), manifest.size()));
      } else {
        plan.wait_sealed();
        br.setManifest(kj::arrayPtr(b.manifest.data(), b.manifest.size()));
      }
      br.setDataFollows(data->data_follows());
      ch.send(m, deadline, phase);
      data->after_header(ch, slot, b.bytes, deadline, phase);
      result.bytes += b.bytes;
      result.buckets += 1;
      {
        std::lock_guard lock(mutex);
        results[index].buckets = result.buckets;
        results[index].bytes = result.bytes;
      }
      if (options.progress) {
        PushProgress p;
        p.event = PushProgress::Event::bucket;
        p.version = version;
        p.receivers = options.receivers.size();
        p.receiver = index;
        p.bytes_done = result.bytes;
        p.bytes_total = plan.bucket_total;
        options.progress(p);
      }
      announce_s += seconds_since(announce_start);
      if (options.after_bucket) options.after_bucket(address, k);
    };
    auto await_ack = [&] {
      const auto ack_start = Clock::now();
      wait_ack(ch, acked, plan, tensors, direct);
      ack_s += seconds_since(ack_start);
      ++acked;
    };
    if (direct) {
      // Pipelined: group g's copies are queued before group g-1 is announced, so the copies run
      // back to back while the control messages go out. No slot is written; acks still bound
      // the groups in flight.
      auto finish_and_announce = [&](std::size_t g, Clock::time_point deadline) {
        const auto deliver_start = Clock::now();
        data->finish_pieces(deadline, group_name(g));
        deliver_s += seconds_since(deliver_start);
        for (std::uint32_t k = groups[g].first; k < groups[g].second; ++k) announce(k, deadline);
      };
      auto deadline = deadline_in(options.bucket_timeout);
      // Announced as queued; at most kMaxStartedPieces groups unfinished (data_path.hpp: the
      // next group is queued while two run, so the GPU never has only one group's copies to
      // do), and a group's acks are awaited once its copies completed (bounding what is in
      // flight).
      std::size_t started = queued_early;
      std::size_t finished = 0;
      auto finish_oldest = [&] {
        const auto deliver_start = Clock::now();
        data->finish_pieces(deadline_in(options.bucket_timeout), group_name(finished));
        deliver_s += seconds_since(deliver_start);
        ++finished;
      };
      for (std::size_t g = 0; g < groups.size() && prints_at_commit; ++g) {
        // The next group's copies are queued before this group is announced (an announcement of
        // 128 tensors costs ~35 us): the GPU gets them sooner.
        while (started < std::min(g + 2, groups.size())) {
          if (started >= kMaxStartedPieces) {
            finish_oldest();
            while (acked < groups[finished - 1].second) await_ack();
          }
          start_group(started, deadline_in(options.bucket_timeout));
          ++started;
        }
        const auto group_deadline = deadline_in(options.bucket_timeout);
        for (std::uint32_t k = groups[g].first; k < groups[g].second; ++k) {
          announce(k, group_deadline);
        }
      }
      while (prints_at_commit && finished < started) finish_oldest();
      for (std::size_t g = 0; g < groups.size() && !prints_at_commit; ++g) {
        if (g >= kSlots) {
          while (acked < groups[g - kSlots].second) await_ack();
        }
        if (g >= queued_early) start_group(g, deadline_in(options.bucket_timeout));
        if (g > 0) finish_and_announce(g - 1, deadline);
        deadline = deadline_in(options.bucket_timeout);
      }
      if (!groups.empty() && !prints_at_commit) finish_and_announce(groups.size() - 1, deadline);
    }
    for (std::uint32_t k = 0; k < count && !direct; ++k) {
      const std::string phase = fmt::format("bucket {}", k);
      const std::uint32_t slot = k % kSlots;
      if (k >= kSlots) await_ack();
      const auto& b = plan.buckets[k];
      const auto deadline = deadline_in(options.bucket_timeout);
      const auto deliver_start = Clock::now();
      if (b.cuda && data->delivers_pieces(FERRY_MEMORY_CUDA)) {
        data->deliver_pieces(slot, k, pieces_of(b), deadline, phase);
      } else {
        auto dst = data->slot(slot);
        std::uint64_t cursor = 0;
        for (const auto& [t, offset] : b.items) {
          // Zero the alignment padding so the bytes on the wire are deterministic.
          if (offset > cursor) std::memset(dst.data() + cursor, 0, offset - cursor);
          const auto size = plan.sizes[t];
          copy_to_host(dst.data() + offset, tensors[t], size);
          cursor = offset + size;
        }
        data->deliver(slot, k, b.bytes, deadline, phase);
      }
      const double bucket_deliver_s = seconds_since(deliver_start);
      deliver_s += bucket_deliver_s;
      logger("sender")->debug("{}: bucket {}: {} tensors, {} bytes delivered in {:.3f} ms",
                              address, k, b.items.size(), b.bytes, bucket_deliver_s * 1e3);
      announce(k, deadline);
    }
    {
      const auto ack_start = Clock::now();
      while (acked < count) {
        wait_ack(ch, acked, plan, tensors, direct);
        ++acked;
      }
      ack_s += seconds_since(ack_start);
    }
    // ---- commit
    const auto commit_start = Clock::now();
    {
      capnp::MallocMessageBuilder m;
      auto commit = m.initRoot<wire::Message>().initCommit();
      commit.setVersion(version);
      if (prints_at_commit) {
        // Every copy completed (finish_pieces): the fingerprints are in.
        std::uint32_t entries = 0;
        for (const auto& b : plan.buckets) entries += static_cast<std::uint32_t>(b.items.size());
        auto list = commit.initFingerprints(entries);
        std::uint32_t at = 0;
        for (const auto& b : plan.buckets) {
          for (const auto& item : b.items) list.set(at++, session_prints[item.first]);
        }
      }
      ch.send(m, deadline_in(options.commit_timeout), "commit");
      auto msg = ch.recv(deadline_in(options.commit_timeout), "commit", kAnswerSpin);
      auto root = msg->root();
      if (root.which() == wire::Message::REFUSAL) {
        auto r = root.getRefusal();
        fail(static_cast<ferry_status_code_t>(r.getCode()), "{}: refused the commit: {}",
             ch.peer(), text(r.getMessage()));
      }
      if (root.which() != wire::Message::COMMITTED) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit: unexpected message", ch.peer());
      }
      if (root.getCommitted().getVersion() != version) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: committed version {} instead of {}", ch.peer(),
             root.getCommitted().getVersion(), version);
      }
    }
    logger("sender")->debug(
        "{}: version {}: {} buckets, {} tensors: begin {:.3f} ms{}, delivering {:.3f} ms, "
        "announcing {:.3f} ms, waiting for acks {:.3f} ms, commit {:.3f} ms (receiver's checks "
        "included), session {:.3f} ms",
        address, version, count, tensors.size(), setup_s * 1e3,
        queue_first_early ? " (the first copies queued meanwhile)" : "", deliver_s * 1e3,
        announce_s * 1e3, ack_s * 1e3,
        seconds_since(commit_start) * 1e3, seconds_since(session_start) * 1e3);
  }
};

Sender::Sender(const config::Config& config, const registry::Registry& registry,
               SenderOptions options)
    : impl_(std::make_unique<Impl>(config, registry, std::move(options))) {}

Sender::~Sender() = default;

PushReport Sender::push(std::span<const TensorView> tensors, std::uint64_t version,
                        const std::optional<std::string>& label,
                        const order::StreamOrder& producers) {
  auto& i = *impl_;
  i.wait_teardowns();  // the previous push's
  const auto start = Clock::now();
  if (i.options.receivers.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: no receivers");
  if (tensors.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: no tensors");
  for (const auto& r : i.options.receivers) parse_address(r);
  // From here on this push owns the kept sessions (i.links).
  {
    std::lock_guard lock(i.mutex);
    if (i.running) fail(FERRY_STATUS_FAILED_PRECONDITION, "push: another push is running");
    i.running = true;
    i.aborted = false;
    i.abort_reason.clear();
    i.results.assign(i.options.receivers.size(), ReceiverResult{});
    for (std::size_t k = 0; k < i.results.size(); ++k) i.results[k].address = i.options.receivers[k];
  }
  struct Running {
    Impl& impl;
    ~Running() {
      std::lock_guard lock(impl.mutex);
      impl.running = false;
    }
  } running{i};
  // The names are unique when they are a kept session's catalog (checked at its first push):
  // a comparison, where a set of names costs ~0.5 ms per 4096 tensors.
  std::vector<std::optional<bool>> same_catalog(i.links.size());
  bool known_names = false;
  for (std::size_t r = 0; r < i.links.size(); ++r) {
    if (!i.links[r]) continue;
    i.links[r]->ask_to_stop();
    same_catalog[r] = i.links[r]->same_catalog(tensors);
    known_names = known_names || *same_catalog[r];
  }
  std::unordered_set<std::string_view> names;
  if (!known_names) names.reserve(tensors.size());
  std::uint64_t largest = 0;
  std::uint64_t total = 0;
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: a tensor has an empty name");
    if (!known_names && !names.insert(t.name).second) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' is given twice", t.name);
    }
    if (dtype_size(t.dtype) == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has an invalid dtype", t.name);
    }
    if (t.shape.size() > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has {} dims (at most {})", t.name,
           t.shape.size(), FERRY_MAX_DIMS);
    }
    const auto size = byte_size(t.dtype, t.shape);
    if (!size) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' is too large", t.name);
    sizes.push_back(*size);
    if (t.data == nullptr && *size > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has no data", t.name);
    }
    if (t.memory_kind == FERRY_MEMORY_CUDA && !FERRY_HAVE_CUDA) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "push: tensor '{}' is in CUDA memory but this build has no CUDA (built with "
           "-Dcuda=disabled); copy it to the host first",
           t.name);
    }
    if (t.memory_kind != FERRY_MEMORY_HOST && t.memory_kind != FERRY_MEMORY_PINNED &&
        t.memory_kind != FERRY_MEMORY_CUDA) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "push: tensor '{}' has an unknown memory kind {}",
           t.name, static_cast<unsigned>(t.memory_kind));
    }
    largest = std::max(largest, *size);
    total += *size;
  }
  const std::string version_label = label.value_or(std::to_string(version));

  // Nothing reads a tensor before the work that produced it is done (DESIGN.md, "Stream
  // ordering"): a trainer calls push() right after its optimizer step, whose kernels may still
  // be queued. Every read below (fingerprints, packing, the transports' copies) comes after this.
  const auto wait_start = Clock::now();
  {
    std::vector<int> devices;
    for (const auto& t : tensors) {
      if (t.memory_kind == FERRY_MEMORY_CUDA) devices.push_back(t.device);
    }
    order::wait(producers, devices, fmt::format("push of version {}", version));
  }
  const double producer_wait_s = seconds_since(wait_start);

  // The plan: buckets of at most capacity bytes (one tensor alone may be larger than
  // bucket_bytes: the capacity grows to hold it), manifests encoded once for every receiver.
  PushPlan plan;
  plan.total = total;
  plan.sizes = std::move(sizes);
  plan.cuda_tensors = true;
  for (const auto& t : tensors) {
    if (t.memory_kind != FERRY_MEMORY_CUDA) {
      plan.cuda_tensors = false;
    } else if (plan.device < 0) {
      plan.device = t.device;
    }
  }
  plan.capacity = sdk::bucket_align_up(std::max<std::uint64_t>(
      std::min<std::uint64_t>(i.options.bucket_bytes, sdk::bucket_align_up(total)),
      std::max<std::uint64_t>(largest, 1)));
  {
    const sdk::BucketPacking packing = sdk::pack_buckets(plan.sizes, plan.capacity);
    for (const sdk::PackedBucket& packed : packing.buckets) {
      PlannedBucket& b = plan.buckets.emplace_back();
      for (std::size_t t = packed.first; t < packed.end; ++t) {
        b.items.emplace_back(t, packing.offsets[t]);
        b.cuda = b.cuda && tensors[t].memory_kind == FERRY_MEMORY_CUDA;
      }
      b.bytes = packed.bytes;
    }
    if (plan.buckets.empty()) plan.buckets.emplace_back();  // no tensors: one empty bucket
  }
  for (const auto& b : plan.buckets) plan.bucket_total += b.bytes;
  // Fingerprints and manifests, side by side with the sessions' set-up (PushPlan::seal), on a
  // thread joined before `plan` goes (join_sealing, declared after it).
  double plan_s = 0;
  std::packaged_task<void()> sealing([&] {
    const auto fingerprint_start = Clock::now();
    std::vector<std::uint64_t> prints(tensors.size());
    fingerprint_device_tensors(tensors, prints);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (tensors[t].memory_kind != FERRY_MEMORY_CUDA) {
        prints[t] = fingerprint_tensor(tensors[t], i.options.threads);
      }
    }
    const auto count = static_cast<std::uint32_t>(plan.buckets.size());
    for (std::uint32_t k = 0; k < count; ++k) {
      auto& b = plan.buckets[k];
      for (const auto& item : b.items) b.fingerprints.push_back(prints[item.first]);
      b.manifest = bucket_manifest(plan, k, tensors, version, version_label, prints);
    }
    plan_s = seconds_since(fingerprint_start);
  });
  plan.sealed = sealing.get_future().share();
  std::thread sealing_thread;
  std::once_flag sealing_once;
  std::atomic<bool> sealing_started{false};
  plan.seal = [&] {
    std::call_once(sealing_once, [&] {
      sealing_thread = std::thread(std::move(sealing));
      sealing_started = true;
    });
  };
  struct JoinSealing {
    std::thread& thread;
    ~JoinSealing() {
      if (thread.joinable()) thread.join();
    }
  } join_sealing{sealing_thread};
  // CUDA tensors may go where the copies fingerprint what they write (the sessions decide);
  // anything else needs the plan's fingerprints, computed from now on.
  if (!plan.cuda_tensors) plan.seal();

  const double prepare_s = seconds_since(start);
  // Progress: begin now, end however push() leaves from here on.
  struct ProgressEnds {
    const std::function<void(const PushProgress&)>& progress;
    PushProgress last;
    ~ProgressEnds() {
      if (!progress) return;
      last.event = PushProgress::Event::end;
      try {
        progress(last);
      } catch (...) {
        // A display that fails must not turn a push's outcome into an exception.
      }
    }
  } progress_ends{i.options.progress, {}};
  progress_ends.last.version = version;
  progress_ends.last.receivers = i.options.receivers.size();
  progress_ends.last.bytes_total = plan.bucket_total;
  if (i.options.progress) i.options.progress(progress_ends.last);
  if (i.options.receivers.size() == 1) {
    i.run_receiver(0, tensors, plan, version, version_label,
                   same_catalog.empty() ? std::nullopt : same_catalog[0]);  // no thread to start
  } else {
    std::vector<std::thread> threads;
    threads.reserve(i.options.receivers.size());
    for (std::size_t r = 0; r < i.options.receivers.size(); ++r) {
      threads.emplace_back([&, r] {
        i.run_receiver(r, tensors, plan, version, version_label,
                       r < same_catalog.size() ? same_catalog[r] : std::nullopt);
      });
    }
    for (auto& t : threads) t.join();
  }
  try {
    if (sealing_started) plan.sealed.get();
  } catch (const std::exception& e) {
    // Every receiver saw this failure already; the report says so.
    logger("sender")->warn("push of version {}: fingerprints: {}", version, e.what());
  }

  PushReport report;
  report.version = version;
  report.bytes = total;
  {
    std::lock_guard lock(i.mutex);
    report.receivers = i.results;
  }
  report.seconds = seconds_since(start);
  report.producer_wait_seconds = producer_wait_s;
  progress_ends.last.all_committed = report.all_committed();
  logger("sender")->debug(
      "push of version {}: {} tensors, {} bytes: waiting for the producers ({}) {:.3f} ms, checks "
      "and buckets {:.3f} ms, fingerprints + manifests {:.3f} ms, total {:.3f} ms (sessions "
      "included)",
      version, tensors.size(), total, order::wait_name(producers.wait), producer_wait_s * 1e3,
      prepare_s * 1e3, plan_s * 1e3, report.seconds * 1e3);
  return report;
}

void Sender::abort(const std::string& reason) {
  auto& i = *impl_;
  std::lock_guard lock(i.mutex);
  if (!i.running) return;
  i.aborted = true;
  i.abort_reason = reason;
  for (auto* c : i.channels) c->shutdown();
  for (auto* d : i.data_paths) d->abort(reason);
}

std::vector<ReceiverResult> Sender::status() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->results;
}

}  // namespace ferry::session
