// ucx/ucx_transport.cpp: the UCX transport instance: context and worker setup, the progress
// thread, endpoints with peer failure handling, memory registration (and memory UCX allocates)
// and remote keys, and the tagged-rendezvous / RMA-put requests with deadlines and abort; a put
// into a same-host peer's alloc_memory segment, mapped here, is a copy (shared_segment.hpp). See
// ucx_transport.hpp for the threading contract and README.md for the behaviour the host relies on.
#include "ucx_transport.hpp"

#include "process_state.hpp"

#include <ferry/sdk/error.hpp>

#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>

namespace ferry::ucx {
namespace {

constexpr const char* kName = "ucx";
constexpr std::int64_t kLivenessPeriodNs = 100'000'000;  // error_mode = none: peer pid checks

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void log(ferry_log_level_t level, const std::string& message) {
  ferry::sdk::log(level, kName, message);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// What makes two processes "on the same host" for the plugin: one kernel (boot id) and one PID
// namespace, so that /proc/<pid> of the peer is the peer (two containers on one machine share the
// boot id, not the PID namespace).
std::string process_space() {
  char ns[128] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  return read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         (n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : std::string("?"));
}

const char* mode_name(ErrorMode mode) {
  switch (mode) {
    case ErrorMode::none:
      return "none";
    case ErrorMode::peer:
      return "peer";
    case ErrorMode::automatic:
      return "auto";
  }
  return "?";
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

bool is_peer_failure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

// The transports of an endpoint's lanes and whether put is worth using, from ucp_ep_print_info
// (UCX 1.13 has no query for it). A lane line reads
//   "lane[2]:  2:cma/memory.0 md[2]  -> md[2]/cma/sysdev[255] rma_bw#0".
// put is chosen when an rma_bw lane runs over RDMA, mapped shared memory or mapped GPU memory
// (cuda_ipc). Not over tcp (UCX
// emulates RMA: ~1% of tagged throughput) and not over cma: there a put of 1 MiB took ~1.6 ms
// while a tagged rendezvous of the same bucket (receiver-driven cma reads) took ~0.6 ms (UCX
// 1.13.1, measured here), so tagged buckets are faster on cma-only shared memory.
void describe_lanes(ucp_ep_h ep, std::string* lanes, bool* rma_native) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return;
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::istringstream in(std::string(text, size));
  std::free(text);
  std::string line;
  *rma_native = false;
  lanes->clear();
  while (std::getline(in, line)) {
    const auto at = line.find("lane[");
    if (at == std::string::npos) continue;
    const auto colon = line.find(':', at);
    if (colon == std::string::npos) continue;
    std::string_view rest = trim(std::string_view(line).substr(colon + 1));
    // rest: "2:cma/memory.0 md[2] ..."
    const auto idx = rest.find(':');
    const auto slash = rest.find('/');
    if (idx == std::string_view::npos || slash == std::string_view::npos || slash < idx) continue;
    const std::string transport(rest.substr(idx + 1, slash - idx - 1));
    const bool rma_lane = line.find("rma_bw#") != std::string::npos;
    if (!lanes->empty()) *lanes += ",";
    *lanes += transport + (rma_lane ? "(rma)" : "");
    // cuda_copy copies between host and GPU memory within one process: not a way into the peer.
    if (rma_lane && transport != "tcp" && transport != "cma" && transport != "cuda_copy") {
      *rma_native = true;
    }
  }
  if (lanes->empty()) *lanes = "unknown";
}

void send_callback(void* request, ucs_status_t status, void* user_data) {
  auto* r = static_cast<ferry_request*>(user_data);
  r->owner->complete_locked(r, status, r->expected_length);
  ucp_request_free(request);
}

void recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                   void* user_data) {
  auto* r = static_cast<ferry_request*>(user_data);
  r->owner->complete_locked(r, status, info != nullptr ? info->length : 0);
  ucp_request_free(request);
}

void endpoint_error_callback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<ferry_peer*>(arg);
  peer->owner->peer_failed_locked(peer, fmt::format("UCX reported {}", ucs_status_string(status)));
}

std::uint32_t parse_u32(std::string_view key, std::string_view value, std::uint32_t lo,
                        std::uint32_t hi) {
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < lo || n > hi) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ucx transport option '{}' = '{}': must be an integer from {} to {}", key, value, lo, hi);
  }
  return n;
}

}  // namespace

Options parse_options(const ferry_option_t* options, std::size_t count) {
  Options o;
  for (std::size_t i = 0; i < count; ++i) {
    const std::string_view key = options[i].key ? options[i].key : "";
    const std::string_view value = options[i].value ? options[i].value : "";
    if (key == "tls") {
      if (value.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx transport option 'tls' is empty");
      o.tls = std::string(value);
    } else if (key == "error_mode") {
      if (value == "auto") {
        o.error_mode = ErrorMode::automatic;
      } else if (value == "peer") {
        o.error_mode = ErrorMode::peer;
      } else if (value == "none") {
        o.error_mode = ErrorMode::none;
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "ucx transport option 'error_mode' = '{}': must be 'auto', 'peer' or 'none'", value);
      }
    } else if (key == "rma") {
      if (value == "auto") {
        o.rma = RmaPolicy::automatic;
      } else if (value == "always") {
        o.rma = RmaPolicy::always;
      } else if (value == "never") {
        o.rma = RmaPolicy::never;
      } else {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "ucx transport option 'rma' = '{}': must be 'auto', 'always' or 'never'", value);
      }
    } else if (key == "keepalive_interval") {
      if (value.empty()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx transport option 'keepalive_interval' is empty");
      }
      o.keepalive_interval = std::string(value);
    } else if (key == "spin_polls") {
      o.spin_polls = parse_u32(key, value, 1, 1u << 30);
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ucx transport: unknown option '{}' (known: tls, error_mode, rma, keepalive_interval, "
           "spin_polls)",
           key);
    }
  }
  return o;
}

bool tls_allows_shared_memory(const std::optional<std::string>& tls) {
  if (!tls) return true;
  std::string_view list = *tls;
  const bool exclude = !list.empty() && list.front() == '^';  // UCX: "^tcp" = all but tcp
  if (exclude) list.remove_prefix(1);
  bool named = false;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string_view name = trim(list.substr(0, comma));
    named = named || name == "sm" || name == "shm" || name == "sysv" || name == "posix" ||
            name == "mm" || name == "all";
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return exclude ? !named : named;
}

bool peer_errors_for(ErrorMode mode, bool same_host) {
  return mode == ErrorMode::peer || (mode == ErrorMode::automatic && !same_host);
}

std::uint32_t supported_memory_kinds() {
  static const std::uint32_t kinds = [] {
    std::uint32_t k = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED;
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return k;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    ucp_context_h context = nullptr;
    const ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) return k;
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(context, &attr) == UCS_OK &&
        (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0) {
      k |= FERRY_MEMORY_CUDA;
    }
    ucp_cleanup(context);
    return k;
  }();
  return kinds;
}

}  // namespace ferry::ucx

using ferry::fail;
using ferry::ucx::now_ns;

// ---- lifecycle ---------------------------------------------------------------------------------

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args,
                                 ferry::ucx::Options opts)
    : role(args.role), options(std::move(opts)) {
  if (role != FERRY_ROLE_SENDER && role != FERRY_ROLE_RECEIVER) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx create: role {} is neither sender nor receiver",
         static_cast<int>(role));
  }
  memory_kinds = ferry::ucx::supported_memory_kinds();
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    fail(FERRY_STATUS_INTERNAL, "ucx create: ucp_config_read failed: {}", ucs_status_string(status));
  }
  auto modify = [&](const char* name, const std::string& value, const char* option) {
    const ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx transport option '{}' = '{}': UCX refused it ({})",
           option, value, ucs_status_string(s));
    }
  };
  if (options.tls) modify("TLS", *options.tls, "tls");
  modify("KEEPALIVE_INTERVAL", options.keepalive_interval, "keepalive_interval");
  // UCX 1.13's new protocol engine (UCX_PROTO_ENABLE=y) completed puts into user memory over
  // shared memory without writing the bytes (measured here: `ferry bench ucx` reported CORRUPT),
  // so on 1.13 the plugin pins the classic protocols. Later UCX (1.22, the PyPI build with CUDA)
  // keeps the new engine: its classic protocols refuse put ("Unsupported operation") and the new
  // one is what moves CUDA memory by cuda_ipc. Both are tested (tests/ucx, either build).
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major == 1 && minor < 14) (void)ucp_config_modify(config, "PROTO_ENABLE", "n");

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
  params.mt_workers_shared = 0;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context = nullptr;
    fail(FERRY_STATUS_IO, "ucx create: ucp_init failed: {} (tls = '{}')", ucs_status_string(status),
         options.tls.value_or("UCX default"));
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  status = ucp_worker_create(context, &worker_params, &worker);
  if (status != UCS_OK) {
    ucp_cleanup(context);
    fail(FERRY_STATUS_IO, "ucx create: ucp_worker_create failed: {}", ucs_status_string(status));
  }
  ucp_address_t* address = nullptr;
  size_t address_size = 0;
  status = ucp_worker_get_address(worker, &address, &address_size);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    fail(FERRY_STATUS_IO, "ucx create: ucp_worker_get_address failed: {}",
         ucs_status_string(status));
  }
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(address);
  worker_address.assign(bytes, bytes + address_size);
  ucp_worker_release_address(worker, address);
  own_stream = ferry::ucx::stream_id(worker_address);

  ferry::ucx::log(
      FERRY_LOG_DEBUG,
      fmt::format("UCX {}.{}.{} worker ready ({}): tls = {}, error_mode = {}, rma = {}; GPU "
                  "memory: {}",
                  major, minor, release, role == FERRY_ROLE_SENDER ? "sender" : "receiver",
                  options.tls.value_or("UCX default"),
                  ferry::ucx::mode_name(options.error_mode),
                  options.rma == ferry::ucx::RmaPolicy::automatic ? "auto"
                  : options.rma == ferry::ucx::RmaPolicy::always  ? "always"
                                                                  : "never",
                  (memory_kinds & FERRY_MEMORY_CUDA) != 0
                      ? "registered directly (UCX built with CUDA)"
                      : "not supported by this UCX build; the host stages device memory through "
                        "pinned host memory"));
  copy_into_segments = ferry::ucx::tls_allows_shared_memory(options.tls);
  own_process_space = ferry::ucx::process_space();
  progress_thread = std::thread([this] { progress_loop(); });
}

ferry_transport::~ferry_transport() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  changed.notify_all();
  if (progress_thread.joinable()) progress_thread.join();

  std::unique_lock lock(mutex);
  // Cancel what can be cancelled and close every endpoint; UCX completes their requests.
  for (ferry_request* r : std::vector<ferry_request*>(requests.begin(), requests.end())) {
    if (requests.count(r) != 0) {
      fail_request_locked(r, FERRY_STATUS_ABORTED, r->what + ": transport destroyed");
      cancel_ucx_locked(r);
    }
  }
  for (ferry_peer* p : peers) close_endpoint_locked(p, true);
  // Wait (at most 1 s) for the endpoint closes and for every request but the receives UCX
  // already matched to a message: a matched receive cannot be cancelled (UCX 1.13 cancels only
  // receives still waiting for a match) and, with its sender's endpoint closed, may never end; it
  // reads nothing of ours, nothing more arrives for it, and ucp_worker_destroy releases it.
  // (Every ended session used to wait the whole second here, on both sides: operations that
  // completed inside their starting call were counted as held forever; see finish_start_locked.)
  const auto still_running = [this] {
    if (!closing.empty()) return true;
    std::size_t held_receives = 0;
    for (const ferry_request* r : requests) held_receives += r->ucx != nullptr && r->is_recv;
    return outstanding > held_receives;
  };
  const std::int64_t give_up = now_ns() + 1'000'000'000;
  const std::int64_t close_began = now_ns();
  while (still_running() && now_ns() < give_up) {
    ucp_worker_progress(worker);
    reap_closing_locked();
  }
  if (still_running()) {
    std::string held;
    for (const ferry_request* r : requests) {
      if (r->ucx != nullptr) held += (held.empty() ? "" : ", ") + r->what;
    }
    ferry::ucx::log(FERRY_LOG_DEBUG,
                    fmt::format("ucx transport destroyed after {:.0f} ms with {} endpoint "
                                "close(s) and {} request(s) still held by UCX (receives "
                                "included){}{}",
                                (now_ns() - close_began) / 1e6, closing.size(), outstanding,
                                held.empty() ? "" : ": ", held));
  }
  for (ferry_peer* p : peers) {
    for (auto& [sum, rkey] : p->rkeys) ucp_rkey_destroy(rkey);
    delete p;
  }
  peers.clear();
  for (ferry_memory* m : memories) {
    ucp_mem_unmap(context, m->memh);
    delete m;
  }
  memories.clear();
  // Callbacks of requests UCX still holds may run inside ucp_worker_destroy; their wrappers stay
  // valid until after it.
  ucp_worker_destroy(worker);
  for (ferry_request* r : requests) delete r;
  requests.clear();
  ucp_cleanup(context);
}

// ---- progress ----------------------------------------------------------------------------------

void ferry_transport::progress_loop() {
  std::unique_lock lock(mutex);
  std::uint32_t idle = 0;
  while (!stopping) {
    if (waiters > 0) {
      // A waiter drives the worker itself (lower latency than a hand-off between threads).
      changed.wait_for(lock, std::chrono::milliseconds(1));
      idle = 0;
      continue;
    }
    const unsigned progressed = progress_once_locked();
    yield_if_wanted(lock);
    if (progressed > 0) {
      idle = 0;
      continue;
    }
    ++idle;
    if (outstanding == 0 && closing.empty()) {
      // Nothing in flight: spin `spin_polls` empty polls, then park until a request starts. Not
      // at once: a peer's puts where UCX emulates RMA by active messages (shared memory on UCX
      // 1.13) and its flushes land only while this side polls; parked at once, each took a
      // millisecond wakeup (1 MiB puts at 0.4 GB/s). Parked, it wakes every millisecond anyway,
      // so that wireup, unexpected messages and peer failures are still noticed.
      if (idle <= options.spin_polls) continue;
      changed.wait_for(lock, std::chrono::milliseconds(1));
      // A request started: spin for it; still idle: park again after the next empty poll.
      idle = outstanding == 0 && closing.empty() ? options.spin_polls : 0;
      continue;
    }
    nap_if_idle(lock, idle);
  }
}

unsigned ferry_transport::progress_once_locked() {
  const unsigned progressed = ucp_worker_progress(worker);
  if (peers_to_reap) reap_failed_peers_locked();
  if (!closing.empty()) reap_closing_locked();
  if (liveness_checked && now_ns() >= next_liveness_ns) {
    check_liveness_locked();
    next_liveness_ns = now_ns() + ferry::ucx::kLivenessPeriodNs;
  }
  return progressed;
}

void ferry_transport::yield_if_wanted(std::unique_lock<std::mutex>& lock) {
  if (wake_pending || api_waiting.load(std::memory_order_relaxed) > 0) {
    // Let a woken waiter or an API call take the mutex before polling again.
    wake_pending = false;
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
}

void ferry_transport::nap_if_idle(std::unique_lock<std::mutex>& lock, std::uint32_t idle) {
  if (idle < options.spin_polls) return;
  // Still idle with work outstanding (a slow peer, or a request UCX cannot cancel): nap, 20 us
  // doubling up to 1 ms, so that waiting does not burn a core.
  const auto nap = std::chrono::microseconds(std::min<std::uint32_t>(
      1000, 20u << std::min<std::uint32_t>(6, (idle - options.spin_polls) / 64)));
  lock.unlock();
  std::this_thread::sleep_for(nap);
  lock.lock();
}

std::unique_lock<std::mutex> ferry_transport::api_lock() {
  api_waiting.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(mutex);
  api_waiting.fetch_sub(1, std::memory_order_relaxed);
  return lock;
}

void ferry_transport::check_liveness_locked() {
  for (ferry_peer* p : peers) {
    if (!p->failed && p->same_host && p->pid != 0 && ferry::ucx::process_gone(p->pid)) {
      peer_failed_locked(p, fmt::format("process {} is gone", p->pid));
    }
  }
}

void ferry_transport::peer_failed_locked(ferry_peer* peer, const std::string& why) {
  if (peer->failed) return;
  peer->failed = true;
  peer->failure = fmt::format("peer {} failed: {}", peer->name, why);
  // An error where it fails data this side is sending; a peer that goes while nothing is being
  // sent to it is a session ending (its side closed first, a normal event: debug). Receives still
  // posted for it fail with this message, and the host, which knows whether an update was in
  // progress, reports that.
  bool sending = false;
  for (ferry_request* r : requests) sending = sending || (r->peer == peer && !r->is_recv);
  ferry::ucx::log(sending ? FERRY_LOG_ERROR : FERRY_LOG_DEBUG,
                  sending ? peer->failure : peer->failure + " (nothing was being sent to it)");
  for (ferry_request* r : requests) {
    if (r->peer == peer) fail_request_locked(r, FERRY_STATUS_PEER_FAILED, peer->failure + " (" + r->what + ")");
  }
  peers_to_reap = true;
  changed.notify_all();
}

void ferry_transport::reap_failed_peers_locked() {
  peers_to_reap = false;
  for (ferry_request* r : std::vector<ferry_request*>(requests.begin(), requests.end())) {
    if (requests.count(r) != 0 && r->peer != nullptr && r->peer->failed) cancel_ucx_locked(r);
  }
  for (ferry_peer* p : peers) {
    if (p->failed && p->ep != nullptr) close_endpoint_locked(p, true);
  }
}

void ferry_transport::reap_closing_locked() {
  for (auto it = closing.begin(); it != closing.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing.erase(it);
    } else {
      ++it;
    }
  }
}

void ferry_transport::close_endpoint_locked(ferry_peer* peer, bool force) {
  if (peer->ep == nullptr) return;
  for (auto& [sum, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
  peer->rkeys.clear();
  peer->segments.clear();  // unmaps (nothing copies now: copies run under the mutex)
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // Forcing is only safe when both sides handle peer errors (ucp.h); otherwise flush-close.
  param.flags = force && peer->peer_errors ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t status = ucp_ep_close_nbx(peer->ep, &param);
  peer->ep = nullptr;
  if (UCS_PTR_IS_PTR(status)) closing.push_back(status);
  changed.notify_all();
}

// ---- requests ----------------------------------------------------------------------------------

void ferry_transport::fail_request_locked(ferry_request* request, ferry_status_code_t code,
                                          std::string message) {
  if (request->done) return;
  request->done = true;
  request->code = code;
  request->message = std::move(message);
  wake_pending = true;
  changed.notify_all();
}

void ferry_transport::cancel_ucx_locked(ferry_request* request) {
  // Only receives can be cancelled in UCX 1.13; sends, puts and flushes end when their endpoint
  // closes. The callback may run inside ucp_request_cancel and delete a caller-freed request.
  if (request->ucx != nullptr && request->is_recv) ucp_request_cancel(worker, request->ucx);
}

void ferry_transport::complete_locked(ferry_request* request, ucs_status_t status,
                                      std::size_t length) {
  if (request->ucx != nullptr) --outstanding;  // (not counted when it completed while starting)
  request->ucx = nullptr;
  request->ucx_completed = true;
  if (!request->done) {
    if (status == UCS_OK) {
      if (request->is_recv && length > request->expected_length) {
        fail_request_locked(request, FERRY_STATUS_CORRUPT_DATA,
                            fmt::format("{}: the sender sent {} bytes, {} were posted", request->what,
                                        length, request->expected_length));
      } else {
        // A shorter bucket (the last one of an update in a full-size slot) is fine: the host
        // knows the bucket's size from its manifest.
        request->done = true;
      }
    } else if (status == UCS_ERR_UNSUPPORTED) {
      // UCX has no protocol for this operation on this endpoint and memory (a put between memory
      // types no lane connects): nothing was moved; tagged buckets may still go.
      fail_request_locked(request, FERRY_STATUS_UNIMPLEMENTED,
                          fmt::format("{}: UCX reported {} (no protocol for it on this endpoint "
                                      "and memory; send buckets with send_bucket/recv_bucket)",
                                      request->what, ucs_status_string(status)));
    } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      fail_request_locked(request, FERRY_STATUS_CORRUPT_DATA,
                          fmt::format("{}: the sender sent more than the {} bytes posted",
                                      request->what, request->expected_length));
    } else if (aborted) {
      fail_request_locked(request, FERRY_STATUS_ABORTED,
                          fmt::format("{}: aborted: {}", request->what, abort_reason));
    } else if (request->peer != nullptr && (request->peer->failed || ferry::ucx::is_peer_failure(status))) {
      if (!request->peer->failed) {
        peer_failed_locked(request->peer, fmt::format("UCX reported {}", ucs_status_string(status)));
      }
      fail_request_locked(request, FERRY_STATUS_PEER_FAILED,
                          request->peer->failure + " (" + request->what + ")");
    } else {
      fail_request_locked(request, FERRY_STATUS_IO,
                          fmt::format("{}: UCX reported {}", request->what, ucs_status_string(status)));
    }
  }
  wake_pending = true;
  changed.notify_all();
  if (request->caller_freed) {
    requests.erase(request);
    delete request;
  }
}

void ferry_transport::throw_if_aborted_locked() const {
  if (aborted) fail(FERRY_STATUS_ABORTED, "ucx transport aborted: {}", abort_reason);
  if (stopping) fail(FERRY_STATUS_FAILED_PRECONDITION, "ucx transport is being destroyed");
}

ferry_peer* ferry_transport::checked_peer_locked(ferry_peer* peer, const char* call) const {
  if (peer == nullptr || peers.count(peer) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx {}: unknown peer (not connected by this transport)",
         call);
  }
  if (peer->failed) fail(FERRY_STATUS_PEER_FAILED, "{}", peer->failure);
  return peer;
}

ferry_request* ferry_transport::start_locked(ferry_peer* peer, std::string what,
                                             std::int64_t deadline_ns,
                                             std::uint64_t expected_length) {
  auto* r = new ferry_request;
  r->owner = this;
  r->peer = peer;
  r->what = std::move(what);
  r->deadline_ns = deadline_ns;
  r->expected_length = expected_length;
  requests.insert(r);
  return r;
}

void ferry_transport::finish_start_locked(ferry_request* request, ucs_status_ptr_t status) {
  if (UCS_PTR_IS_PTR(status)) {
    // With NO_IMM_CMPL an operation that completes inside the starting call (a small eager send,
    // a receive of a message already here) still returns a handle, but UCX 1.13 has run our
    // callback before returning it (ucp_request_imm_cmpl_param), and the callback freed it: the
    // handle is stale. Holding it counted an operation that never ends in `outstanding`, which
    // kept the progress thread from parking and made every destroy wait its full second.
    if (request->ucx_completed) return;
    request->ucx = status;
    ++outstanding;
    changed.notify_all();  // the progress thread may be parked
    return;
  }
  // Failed (or completed) at once, without a callback.
  complete_locked(request, UCS_PTR_STATUS(status), request->expected_length);
}

ucp_request_param_t ferry_transport::request_param(ferry_request* request) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.send = ferry::ucx::send_callback;
  param.user_data = request;
  return param;
}

void* ferry_transport::local_pointer(const ferry_memory_range_t& range, const char* what) const {
  if (range.memory == nullptr || memories.count(range.memory) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx {}: memory is not registered with this transport",
         what);
  }
  const ferry_memory* m = range.memory;
  if (range.offset > m->size || range.size > m->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ucx {}: range [{}, +{}) lies outside the registered {} bytes", what, range.offset,
         range.size, m->size);
  }
  return static_cast<std::uint8_t*>(m->base) + range.offset;
}

// ---- the ABI operations ------------------------------------------------------------------------

std::vector<std::uint8_t> ferry_transport::address() const {
  ferry::ucx::AddressInfo info;
  info.error_mode = static_cast<std::uint32_t>(options.error_mode);
  info.pid = static_cast<std::uint32_t>(getpid());
  info.process_space = ferry::ucx::process_space();
  info.host = ferry::ucx::host_name();
  info.worker_address = worker_address;
  return ferry::ucx::encode_address(info);
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  const std::string name = args.peer_name != nullptr && args.peer_name[0] != '\0'
                               ? args.peer_name
                               : std::string("peer");
  if (args.num_remote != 1 || args.remote_addresses == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ucx connect to {}: needs exactly one remote address (point-to-point), got {}", name,
         args.num_remote);
  }
  const ferry_blob_t& blob = args.remote_addresses[0];
  if (blob.data == nullptr && blob.size > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx connect to {}: address blob has no data", name);
  }
  const auto info = ferry::ucx::decode_address(
      std::span<const std::uint8_t>(blob.data, static_cast<std::size_t>(blob.size)),
      "ucx connect to " + name);
  const std::string own_space = ferry::ucx::process_space();
  const bool same_host = !info.process_space.empty() && info.process_space == own_space;
  const auto their_mode = static_cast<ferry::ucx::ErrorMode>(info.error_mode);
  const bool peer_errors = ferry::ucx::peer_errors_for(options.error_mode, same_host);
  if (peer_errors != ferry::ucx::peer_errors_for(their_mode, same_host)) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "ucx connect to {}: the peer runs error_mode = {}, this side {}, which give this "
         "{}endpoint different error handling; set the same [transport.ucx] error_mode on both",
         name, ferry::ucx::mode_name(their_mode), ferry::ucx::mode_name(options.error_mode),
         same_host ? "same-host " : "");
  }
  if (!peer_errors && !same_host) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ucx connect to {} on host {}: error_mode = none is for shared memory on one host only "
         "(a dead remote peer could not be detected)",
         name, info.host);
  }

  ferry_request* flush = nullptr;
  ferry_peer* peer = nullptr;
  {
    auto lock = api_lock();
    throw_if_aborted_locked();
    auto owned = std::make_unique<ferry_peer>();
    owned->owner = this;
    owned->name = name;
    owned->same_host = same_host;
    owned->peer_errors = peer_errors;
    liveness_checked = liveness_checked || !peer_errors;
    owned->pid = info.pid;
    owned->sender_stream =
        role == FERRY_ROLE_SENDER ? own_stream : ferry::ucx::stream_id(info.worker_address);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(info.worker_address.data());
    params.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (peer_errors) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_handler.cb = ferry::ucx::endpoint_error_callback;
      params.err_handler.arg = owned.get();
    }
    const ucs_status_t status = ucp_ep_create(worker, &params, &owned->ep);
    if (status != UCS_OK) {
      fail(FERRY_STATUS_PEER_FAILED,
           "ucx connect to {} ({}, pid {}): no usable transport to the peer: {} (tls = '{}'; "
           "with error_mode = peer UCX 1.13 cannot use sysv/posix shared memory)",
           name, info.host, info.pid, ucs_status_string(status), options.tls.value_or("UCX default"));
    }
    ferry::ucx::describe_lanes(owned->ep, &owned->lanes, &owned->rma_native);
    peer = owned.release();
    peers.insert(peer);
    // Flushing a fresh endpoint completes once wireup with the peer is done: that is "connected".
    flush = start_locked(peer, "connecting to " + name, args.deadline_ns, 0);
    ucp_request_param_t param = request_param(flush);
    finish_start_locked(flush, ucp_ep_flush_nbx(peer->ep, &param));
  }
  try {
    request_wait(flush, args.deadline_ns);
  } catch (...) {
    request_free(flush);
    disconnect(peer);
    throw;
  }
  request_free(flush);
  const bool put_allowed = options.rma == ferry::ucx::RmaPolicy::always ||
                           (options.rma == ferry::ucx::RmaPolicy::automatic && peer->rma_native);
  const bool mapped_put =
      options.rma != ferry::ucx::RmaPolicy::never && same_host && copy_into_segments;
  ferry::ucx::log(
      FERRY_LOG_DEBUG,
      fmt::format("connected to {} ({}, pid {}): lanes {}; errors: {}; RMA {}; primitive: {}",
                  name, info.host, info.pid, peer->lanes,
                  peer->peer_errors ? "UCX peer error handling"
                                    : "none in UCX, the peer's /proc entry checked every 100 ms",
                  peer->rma_native ? "native (RDMA or mapped shared memory)"
                                   : "emulated (tcp) or slower than tagged rendezvous (cma)",
                  mapped_put
                      ? (put_allowed ? "put + flush: a copy into the peer's alloc_memory segments "
                                       "(mapped here, same host), UCX put into other registered "
                                       "memory"
                                     : "put + flush (a copy) into the peer's alloc_memory "
                                       "segments, mapped here (same host); tagged rendezvous "
                                       "into other memory")
                  : put_allowed ? "put + flush into registered memory (tagged rendezvous also served)"
                                : "tagged rendezvous into posted buffers (put refused)"));
  return peer;
}

void ferry_transport::disconnect(ferry_peer* peer) {
  auto lock = api_lock();
  if (peer == nullptr || peers.count(peer) == 0) return;
  for (ferry_request* r : std::vector<ferry_request*>(requests.begin(), requests.end())) {
    if (requests.count(r) == 0 || r->peer != peer) continue;
    fail_request_locked(r, FERRY_STATUS_FAILED_PRECONDITION, r->what + ": peer disconnected");
    cancel_ucx_locked(r);
    if (requests.count(r) != 0) r->peer = nullptr;
  }
  close_endpoint_locked(peer, true);
  peers.erase(peer);
  delete peer;
}

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.base == nullptr || desc.size == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx register_memory: base is NULL or size is 0");
  }
  ucs_memory_type_t type = UCS_MEMORY_TYPE_HOST;
  switch (desc.kind) {
    case FERRY_MEMORY_HOST:
    case FERRY_MEMORY_PINNED:
      break;
    case FERRY_MEMORY_CUDA:
      if ((memory_kinds & FERRY_MEMORY_CUDA) == 0) {
        fail(FERRY_STATUS_UNIMPLEMENTED,
             "ucx register_memory: this UCX build has no CUDA support; stage device memory "
             "through pinned host memory");
      }
      type = UCS_MEMORY_TYPE_CUDA;
      break;
    default:
      fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx register_memory: unknown memory kind {}",
           static_cast<int>(desc.kind));
  }
  auto lock = api_lock();
  throw_if_aborted_locked();
  const ucp_mem_h memh = map_locked(desc.base, desc.size, type, "register_memory");
  auto* m = new ferry_memory{desc.base, desc.size, desc.kind, memh};
  memories.insert(m);
  return m;
}

ucp_mem_h ferry_transport::map_locked(void* base, std::uint64_t size, ucs_memory_type_t type,
                                      const char* call) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = size;
  params.memory_type = type;
  ucp_mem_h memh = nullptr;
  const ucs_status_t status = ucp_mem_map(context, &params, &memh);
  if (status != UCS_OK) {
    fail(status == UCS_ERR_NO_MEMORY ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_IO,
         "ucx {} of {} bytes at {}: {}", call, size, base, ucs_status_string(status));
  }
  return memh;
}

ferry::sdk::Allocation ferry_transport::alloc_memory(const ferry_memory_desc_t& desc) {
  if (desc.kind != FERRY_MEMORY_HOST) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "ucx alloc_memory: allocates host memory only (asked for kind {}); register memory of "
         "other kinds with register_memory",
         static_cast<int>(desc.kind));
  }
  if (desc.size == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx alloc_memory: size is 0");
  // A sealed memory file (shared_segment.hpp), registered with UCX like any memory (tagged
  // receives land in it, UCX puts reach it); its key also names the file, which a sender on this
  // host maps and copies into (put), whatever the endpoint's error handling.
  auto segment = std::make_unique<ferry::ucx::OwnedSegment>(desc.size);
  auto lock = api_lock();
  throw_if_aborted_locked();
  const ucp_mem_h memh =
      map_locked(segment->data(), desc.size, UCS_MEMORY_TYPE_HOST, "alloc_memory");
  void* data = segment->data();
  auto* m = new ferry_memory{data, desc.size, desc.kind, memh, std::move(segment)};
  memories.insert(m);
  return {data, m};
}

std::vector<std::uint8_t> ferry_transport::pack_key(ferry_memory* memory) {
  auto lock = api_lock();
  if (memory == nullptr || memories.count(memory) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx pack_key: memory is not registered with this transport");
  }
  void* buffer = nullptr;
  size_t size = 0;
  const ucs_status_t status = ucp_rkey_pack(context, memory->memh, &buffer, &size);
  if (status != UCS_OK) {
    fail(FERRY_STATUS_IO, "ucx pack_key: ucp_rkey_pack failed: {}", ucs_status_string(status));
  }
  ferry::ucx::KeyInfo key;
  key.base = reinterpret_cast<std::uintptr_t>(memory->base);
  key.size = memory->size;
  const auto* bytes = static_cast<const std::uint8_t*>(buffer);
  key.packed_rkey.assign(bytes, bytes + size);
  ucp_rkey_buffer_release(buffer);
  if (memory->segment) {
    key.segment = memory->segment->id();
    key.process_space = own_process_space;
  }
  return ferry::ucx::encode_key(key);
}

void ferry_transport::deregister_memory(ferry_memory* memory) {
  auto lock = api_lock();
  if (memory == nullptr || memories.count(memory) == 0) return;
  ucp_mem_unmap(context, memory->memh);
  memories.erase(memory);
  delete memory;
}

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  auto lock = api_lock();
  throw_if_aborted_locked();
  checked_peer_locked(peer, "send_bucket");
  void* data = local_pointer(bucket.data, "send_bucket");
  ferry_request* r = start_locked(peer, fmt::format("bucket {} to {}", bucket.bucket_index, peer->name),
                                  bucket.deadline_ns, bucket.data.size);
  const ucp_tag_t tag = (static_cast<ucp_tag_t>(peer->sender_stream) << 32) | bucket.bucket_index;
  ucp_request_param_t param = request_param(r);
  finish_start_locked(r, ucp_tag_send_nbx(peer->ep, data, bucket.data.size, tag, &param));
  return r;
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  auto lock = api_lock();
  throw_if_aborted_locked();
  checked_peer_locked(peer, "recv_bucket");
  void* data = local_pointer(bucket.data, "recv_bucket");
  ferry_request* r = start_locked(
      peer, fmt::format("bucket {} from {}", bucket.bucket_index, peer->name), bucket.deadline_ns,
      bucket.data.size);
  r->is_recv = true;
  const ucp_tag_t tag = (static_cast<ucp_tag_t>(peer->sender_stream) << 32) | bucket.bucket_index;
  ucp_request_param_t param = request_param(r);
  param.cb.recv = ferry::ucx::recv_callback;
  finish_start_locked(r, ucp_tag_recv_nbx(worker, data, bucket.data.size, tag,
                                          ~static_cast<ucp_tag_t>(0), &param));
  return r;
}

ucp_rkey_h ferry_transport::rkey_for_locked(ferry_peer* peer, const ferry::ucx::KeyInfo& key) {
  const auto found = peer->rkeys.find(key.checksum);
  if (found != peer->rkeys.end()) return found->second;
  // Keys of this plugin name registered memory only (alloc_memory registers a memory file it
  // made; it never asks UCX to allocate): no sysv/posix segment for UCX to attach here. UCX 1.13
  // crashed on the error path of such an attach (ucp_rkey_destroy of a half-unpacked key) when
  // the owner had died just before.
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, key.packed_rkey.data(), &rkey);
  if (status != UCS_OK) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx put to {}: UCX refused the remote key: {}", peer->name,
         ucs_status_string(status));
  }
  peer->rkeys.emplace(key.checksum, rkey);
  return rkey;
}

ferry_request* ferry_transport::put(ferry_peer* peer, const ferry_put_args_t& args) {
  if (args.remote_key == nullptr || (args.remote_key->data == nullptr && args.remote_key->size > 0)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx put: remote_key is NULL");
  }
  auto lock = api_lock();
  throw_if_aborted_locked();
  checked_peer_locked(peer, "put");
  if (options.rma == ferry::ucx::RmaPolicy::never) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "ucx put to {}: [transport.ucx] rma = never; send buckets with send_bucket/recv_bucket",
         peer->name);
  }
  const auto key = ferry::ucx::decode_key(
      std::span<const std::uint8_t>(args.remote_key->data,
                                    static_cast<std::size_t>(args.remote_key->size)),
      "ucx put to " + peer->name);
  void* data = local_pointer(args.local, "put");
  if (args.remote_offset > key.size || args.local.size > key.size - args.remote_offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ucx put to {}: remote range [{}, +{}) lies outside the peer's registered {} bytes",
         peer->name, args.remote_offset, args.local.size, key.size);
  }
  if (std::uint8_t* segment = segment_for_locked(peer, key, args.local.memory)) {
    // The peer's memory is its alloc_memory segment, mapped here: the put is this copy, the
    // fastest way over shared memory (UCX 1.13 would emulate the put with active messages,
    // copying on both sides), halves of a large one copied by this thread and a helper
    // (split_copy.hpp). The mapping is this process's own and stays valid until the endpoint
    // closes, which waits for the mutex held here: the copy cannot fault, even if the peer
    // died a moment ago (its flush says so). A release fence orders the bytes before whatever
    // the host sends after the flush.
    split_copy.copy(segment + args.remote_offset, data, args.local.size);
    std::atomic_thread_fence(std::memory_order_release);
    peer->copied_since_flush = true;
    // Done already: nobody waits on it yet, so nobody is woken (a wakeup per put set the idle
    // progress thread spinning against the next copy on a 2-core machine).
    ferry_request* r = start_locked(peer, "put (copied)", args.deadline_ns, args.local.size);
    r->ucx_completed = true;
    r->done = true;
    return r;
  }
  if (options.rma == ferry::ucx::RmaPolicy::automatic && !peer->rma_native) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "ucx put to {}: no RDMA or mapped shared memory among lanes {}, and the peer's memory "
         "is not mapped here (only memory its plugin allocated, alloc_memory, on this host and "
         "with tls allowing shared memory, is) "
         "(UCX emulates RMA over tcp at ~1% of tagged throughput; cma put is ~3x slower than "
         "tagged buckets); send buckets with send_bucket/recv_bucket, or set [transport.ucx] "
         "rma = always",
         peer->name, peer->lanes);
  }
  const ucp_rkey_h rkey = rkey_for_locked(peer, key);
  ferry_request* r = start_locked(
      peer, fmt::format("put of {} bytes to {} at offset {}", args.local.size, peer->name,
                        args.remote_offset),
      args.deadline_ns, args.local.size);
  ucp_request_param_t param = request_param(r);
  finish_start_locked(r, ucp_put_nbx(peer->ep, data, args.local.size,
                                     key.base + args.remote_offset, rkey, &param));
  return r;
}

std::uint8_t* ferry_transport::segment_for_locked(ferry_peer* peer,
                                                  const ferry::ucx::KeyInfo& key,
                                                  const ferry_memory* local) {
  // Host memory only (a copy cannot read device memory), into the segment of this very peer on
  // this host, and only where tls allows shared memory.
  if (!copy_into_segments || key.segment.pid == 0 || key.segment.pid != peer->pid ||
      !peer->same_host || key.process_space != own_process_space ||
      (local->kind != FERRY_MEMORY_HOST && local->kind != FERRY_MEMORY_PINNED)) {
    return nullptr;
  }
  if (const auto found = peer->segments.find(key.checksum); found != peer->segments.end()) {
    return found->second.data();
  }
  if (peer->unmappable.count(key.checksum) != 0) return nullptr;
  // The attach is plain system calls that fail with a code (shared_segment.hpp): a peer gone
  // before it is an answer, not a crash.
  ferry::ucx::MappedSegment segment;
  std::string why;
  switch (segment.attach(key.segment, &why)) {
    case ferry::ucx::MappedSegment::Outcome::mapped:
      return peer->segments.emplace(key.checksum, std::move(segment)).first->second.data();
    case ferry::ucx::MappedSegment::Outcome::owner_gone:
      peer_failed_locked(peer, why);
      fail(FERRY_STATUS_PEER_FAILED, "{} (mapping its memory for a put)", peer->failure);
    case ferry::ucx::MappedSegment::Outcome::not_that_file:
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ucx put to {}: the remote key names memory the peer no longer has: {}", peer->name,
           why);
    case ferry::ucx::MappedSegment::Outcome::refused:
      break;
  }
  ferry::ucx::log(FERRY_LOG_DEBUG,
                  fmt::format("put to {}: its memory cannot be mapped here ({}); UCX carries "
                              "puts into it",
                              peer->name, why));
  peer->unmappable.insert(key.checksum);
  return nullptr;
}

ferry_request* ferry_transport::flush(ferry_peer* peer, std::int64_t deadline_ns) {
  auto lock = api_lock();
  throw_if_aborted_locked();
  checked_peer_locked(peer, "flush");
  if (peer->copied_since_flush) {
    // Copies into the peer's mapping succeed whether or not it still runs: a flush covering
    // them is good only while it does (an endpoint without UCX error handling would not say).
    peer->copied_since_flush = false;
    if (peer->same_host && peer->pid != 0 && ferry::ucx::process_gone(peer->pid)) {
      peer_failed_locked(peer, fmt::format("process {} is gone", peer->pid));
      fail(FERRY_STATUS_PEER_FAILED, "{} (flush of the puts copied into its memory)",
           peer->failure);
    }
  }
  ferry_request* r = start_locked(peer, "flush to " + peer->name, deadline_ns, 0);
  ucp_request_param_t param = request_param(r);
  finish_start_locked(r, ucp_ep_flush_nbx(peer->ep, &param));
  return r;
}

bool ferry_transport::settled_locked(ferry_request* request) {
  if (requests.count(request) == 0 || request->caller_freed) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ucx: unknown or freed request");
  }
  if (!request->done && request->deadline_ns > 0 && now_ns() >= request->deadline_ns) {
    fail_request_locked(request, FERRY_STATUS_TIMEOUT,
                        fmt::format("{}: passed its deadline", request->what));
    cancel_ucx_locked(request);
  }
  if (!request->done) return false;
  if (request->code != FERRY_STATUS_OK) throw ferry::Error(request->code, request->message);
  return true;
}

bool ferry_transport::request_test(ferry_request* request) {
  auto lock = api_lock();
  if (!stopping) progress_once_locked();  // a caller polling with test drives the worker too
  return settled_locked(request);
}

void ferry_transport::request_wait(ferry_request* request, std::int64_t deadline_ns) {
  auto lock = api_lock();
  ++waiters;
  struct Leave {
    std::size_t& count;
    ~Leave() { --count; }  // runs before `lock` is released
  } leave{waiters};
  std::uint32_t idle = 0;
  while (!settled_locked(request)) {
    if (deadline_ns > 0 && now_ns() >= deadline_ns) {
      // Only the wait's own deadline passed (the request's would have failed it above).
      fail(FERRY_STATUS_TIMEOUT, "{}: not finished by the wait's deadline (still running)",
           request->what);
    }
    // Progress on wait: this thread polls the worker until the request settles.
    if (progress_once_locked() > 0) {
      idle = 0;
    } else {
      nap_if_idle(lock, ++idle);
    }
    yield_if_wanted(lock);
  }
}

void ferry_transport::request_free(ferry_request* request) noexcept {
  auto lock = api_lock();
  if (request == nullptr || requests.count(request) == 0 || request->caller_freed) return;
  if (request->ucx == nullptr) {
    requests.erase(request);
    delete request;
    return;
  }
  // UCX still holds it: its callback deletes the wrapper. A receive is cancelled now (the
  // callback may run inside the cancel); a send or put runs on until its endpoint closes.
  request->caller_freed = true;
  if (!request->done) {
    request->done = true;
    request->code = FERRY_STATUS_ABORTED;
  }
  cancel_ucx_locked(request);
}

void ferry_transport::abort(const char* why) noexcept {
  try {
    const std::string reason = why != nullptr ? why : "no reason given";
    auto lock = api_lock();
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    ferry::ucx::log(FERRY_LOG_WARN, "ucx transport aborted: " + reason);
    for (ferry_request* r : std::vector<ferry_request*>(requests.begin(), requests.end())) {
      if (requests.count(r) == 0) continue;
      fail_request_locked(r, FERRY_STATUS_ABORTED, fmt::format("{}: aborted: {}", r->what, reason));
      cancel_ucx_locked(r);
    }
    for (ferry_peer* p : peers) close_endpoint_locked(p, true);
    changed.notify_all();
  } catch (...) {
    // Out of memory while aborting: the flag is what matters, and it is set unless copying the
    // reason or locking threw.
  }
}
