// The HTTP/JSON control server of the receiver (see control/http_server.hpp).
#include "control/http_server.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "common/log.hpp"
#include "config/config.hpp"
#include "control/handlers.hpp"
#include "control/http_listener.hpp"
#include "control/requests.hpp"
#include "receiver/receiver.hpp"
#include "receiver/receiver_ckpt.hpp"
#include "group/receiver_groups.hpp"

namespace ferry::control {
namespace {

using nlohmann::json;

// `allowed`: one method or several, ", " between them ("GET, POST").
bool method_allowed(std::string_view allowed, std::string_view method) {
  while (!allowed.empty()) {
    const auto comma = allowed.find(", ");
    if (allowed.substr(0, comma) == method) return true;
    if (comma == std::string_view::npos) break;
    allowed.remove_prefix(comma + 2);
  }
  return false;
}

bool token_matches(const std::string& header, const std::string& token) {
  const std::string expected = "Bearer " + token;
  if (header.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the token length
  for (std::size_t i = 0; i < header.size(); ++i) {
    diff |= static_cast<unsigned char>(header[i] ^ expected[i]);
  }
  return diff == 0;
}

HttpResponse update_from_disk(Context& c, const HttpRequest& req) {
  const auto request = control::parse_disk_update(parse_body(req));
  auto report = with_effects(c, request.effects, [&] {
    return c.receiver.update_from_disk(request.model_path, request.weight_version);
  });
  {
    const std::lock_guard lock(c.state.mutex);
    c.state.model_path = request.model_path;
  }
  json out = report_json(report);
  out["success"] = true;
  out["message"] = "updated from disk";
  out["num_paused_requests"] = 0;
  return reply(200, out);
}

HttpResponse init_group(Context& c, const HttpRequest& req) {
  auto init = control::parse_group_init(parse_body(req));
  c.groups.init(init);
  return reply(200, json{{"success", true},
                         {"message",
                          fmt::format("joined weight-update group '{}'", init.group_name)}});
}

HttpResponse update_from_distributed(Context& c, const HttpRequest& req) {
  const auto request = control::parse_distributed_update(parse_body(req));
  auto report = with_effects(c, request.effects, [&] { return c.groups.update(request); });
  json out = report_json(report);
  out["success"] = true;
  out["message"] = "updated by broadcast";
  return reply(200, out);
}

HttpResponse destroy_group(Context& c, const HttpRequest& req) {
  const json body = parse_body(req);
  const std::string name = control::parse_group_name(body);
  const std::string how = c.groups.destroy(name, control::parse_destroy_timeout(body));
  return reply(200, json{{"success", true},
                         {"teardown", how},
                         {"message",
                          fmt::format("destroyed weight-update group '{}' ({})", name, how)}});
}

HttpResponse update_from_ipc(Context& c, const HttpRequest& req) {
  const auto request = control::parse_ipc_update(parse_body(req));
  auto report = with_effects(
      c, request.effects, [&] { return receiver::update_weights_from_ipc(c.receiver, request); });
  json out = report_json(report);
  out["success"] = true;
  out["message"] = "updated from checkpoint-engine";
  return reply(200, out);
}

HttpResponse weights_by_name(Context& c, const HttpRequest& req) {
  json body = parse_body(req);
  const auto truncate = field<long long>(body, "truncate_size", 100);
  if (truncate < 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "truncate_size must be >= 0");
  auto w = c.receiver.weights_by_name(required_string(body, "name"),
                                      static_cast<std::size_t>(truncate));
  return reply(200, json{{"name", w.name}, {"dtype", dtype_name(w.dtype)}, {"shape", w.shape},
                         {"values", w.values}});
}

HttpResponse update_weight_version(Context& c, const HttpRequest& req) {
  json body = parse_body(req);
  auto label = optional_label(body, "new_version");
  if (!label) fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'new_version' is required");
  c.receiver.set_version_label(*label);
  return reply(200, json{{"success", true}, {"message", "weight version updated"},
                         {"new_version", *label}});
}

HttpResponse weight_version(Context& c, const HttpRequest&) {
  auto v = c.receiver.version();
  return reply(200, json{{"weight_version", v.label}, {"version", v.number}});
}

HttpResponse fingerprints(Context& c, const HttpRequest&) {
  json prints = json::object();
  for (const auto& [name, value] : c.receiver.fingerprints()) {
    prints[name] = fmt::format("{:016x}", value);
  }
  return reply(200, json{{"algorithm", manifest::kFingerprintAlgorithm},
                         {"weight_version", c.receiver.version().label},
                         {"fingerprints", prints}});
}

HttpResponse health(Context& c, const HttpRequest&) {
  auto h = c.receiver.health();
  return reply(h.ready ? 200 : 503,
               json{{"ready", h.ready}, {"state", h.state}, {"reason", h.reason}});
}

HttpResponse metrics(Context& c, const HttpRequest&) {
  HttpResponse res;
  res.content_type = "text/plain; version=0.0.4";
  res.body = c.receiver.metrics_text();
  return res;
}

HttpResponse session_info(Context& c, const HttpRequest&) {
  if (!c.options.session_info) {
    fail(FERRY_STATUS_NOT_FOUND, "this receiver runs no session listener");
  }
  HttpResponse res;
  res.body = c.options.session_info();
  return res;
}

// Where a route's handler runs. `io`: on the I/O thread, for routes that read state no update
// holds (receiver.hpp: health(), version(), metrics_text(), layout() never block), so they answer
// while any number of updates or slow clients wait. Every other route runs on a worker thread:
// mutating ones on the changes' pool, reads that wait for the update lock (weights, fingerprints)
// on the readers'.
enum class Runs { io, worker };

constexpr const char* kSglang = "SGLang";
constexpr const char* kFerry = "ferry";
constexpr const char* kVllm = "vLLM";
constexpr const char* kSglangVllm = "SGLang, vLLM";  // one path, both frameworks' fields

struct Entry {
  Route route;
  Runs runs;
  HttpResponse (*handle)(Context&, const HttpRequest&);
};

// The one table of routes: what docs/http-api.md lists (a test checks both), how each is
// dispatched and what answers it.
const std::vector<Entry> kTable = {
    {{"POST", "/update_weights_from_disk", true, "reload weights from a safetensors path", kSglang},
     Runs::worker, update_from_disk},
    {{"POST", "/init_weights_update_group", true, "join an NCCL weight-update group (rank 0: trainer)", kSglang},
     Runs::worker, init_group},
    {{"POST", "/update_weights_from_distributed", true, "receive one update by NCCL broadcast", kSglang},
     Runs::worker, update_from_distributed},
    {{"POST", "/destroy_weights_update_group", true, "leave and destroy an NCCL weight-update group", kSglang},
     Runs::worker, destroy_group},
    {{"POST", "/update_weights_from_ipc", true, "receive one update from a checkpoint-engine ParameterServer", kSglang},
     Runs::worker, update_from_ipc},
    {{"POST", "/update_weights_from_tensor", true, "receive tensors from the trainer's process (CUDA IPC, shared memory)", kSglang},
     Runs::worker, update_from_tensor},
    {{"POST", "/begin_weight_update", true, "open a weight-update session", kSglang},
     Runs::worker, begin_weight_update},
    {{"POST", "/end_weight_update", true, "close the weight-update session: the engine's post-load processing", kSglang},
     Runs::worker, end_weight_update},
    {{"POST", "/pause_generation", true, "pause the engine's generation", kSglang},
     Runs::worker, pause_generation},
    {{"POST", "/continue_generation", true, "resume the engine's generation", kSglang},
     Runs::worker, continue_generation},
    {{"GET, POST", "/flush_cache", true, "flush the engine's caches", kSglang},
     Runs::worker, flush_cache},
    {{"POST", "/weights_checker", true, "checksum, snapshot, compare or reset the published weights", kSglang},
     Runs::worker, weights_checker},
    {{"POST", "/get_weights_by_name", false, "dtype, shape and first values of a checkpoint tensor", kSglang},
     Runs::worker, weights_by_name},
    {{"POST", "/update_weight_version", true, "set the weight_version label", kSglangVllm},
     Runs::worker, update_weight_version},
    {{"GET", "/get_weight_version", false, "the published weight version", kSglang},
     Runs::io, weight_version},
    {{"POST", "/release_memory_occupation", true, "release memory of the given tags", kSglang},
     Runs::worker, release_memory},
    {{"POST", "/resume_memory_occupation", true, "resume memory of the given tags", kSglang},
     Runs::worker, resume_memory},
    {{"GET", "/model_info", false, "model path, weight version, parameter count", kSglang},
     Runs::io, model_info},
    {{"GET", "/get_model_info", false, "the older name of /model_info", kSglang},
     Runs::io, model_info},
    {{"GET", "/server_info", false, "the receiver's configuration and state", kSglang},
     Runs::io, server_info},
    {{"GET", "/get_server_info", false, "the older name of /server_info", kSglang},
     Runs::io, server_info},
    {{"POST", "/init_weight_transfer_engine", true, "join the NCCL weight-update group (vLLM's init_info)", kVllm},
     Runs::worker, init_weight_transfer_engine},
    {{"POST", "/start_weight_update", true, "open a weight-update session", kVllm},
     Runs::worker, start_weight_update},
    {{"POST", "/update_weights", true, "receive one update by NCCL broadcast (vLLM's update_info)", kVllm},
     Runs::worker, vllm_update_weights},
    {{"POST", "/finish_weight_update", true, "close the session, check a baseline, set the weight version", kVllm},
     Runs::worker, finish_weight_update},
    {{"POST", "/pause", true, "pause generation (mode abort, wait, keep)", kVllm},
     Runs::worker, vllm_pause},
    {{"POST", "/resume", true, "resume generation", kVllm},
     Runs::worker, vllm_resume},
    {{"GET", "/is_paused", false, "whether generation is paused", kVllm},
     Runs::io, vllm_is_paused},
    {{"POST", "/sleep", true, "pause and release every memory tag (level 1 or 2)", kVllm},
     Runs::worker, vllm_sleep},
    {{"POST", "/wake_up", true, "resume memory tags (all, or those named)", kVllm},
     Runs::worker, vllm_wake_up},
    {{"GET", "/is_sleeping", false, "whether the receiver sleeps", kVllm},
     Runs::io, vllm_is_sleeping},
    {{"GET", "/weight_info", false, "the published weight version", kVllm},
     Runs::io, weight_info},
    {{"POST", "/weight_checker", true, "checksum, reset or compare the published weights", kVllm},
     Runs::worker, weight_checker},
    {{"GET", "/get_fingerprints", false, "fingerprint of every parameter (docs/fingerprint.md)", kFerry},
     Runs::worker, fingerprints},
    {{"GET", "/health", false, "200 when ready to serve, 503 with the reason otherwise", kSglang},
     Runs::io, health},
    {{"GET", "/metrics", false, "Prometheus text metrics", kFerry},
     Runs::io, metrics},
    {{"GET", "/ferry/session", false, "where senders open a session (docs/session-protocol.md)", kFerry},
     Runs::io, session_info},
};

}  // namespace

const std::vector<Route>& routes() {
  static const std::vector<Route> all = [] {
    std::vector<Route> out;
    for (const Entry& e : kTable) out.push_back(e.route);
    return out;
  }();
  return all;
}

struct ControlServer::Impl {
  receiver::Receiver& receiver;
  ServerOptions options;
  receiver::WeightUpdateGroups groups{receiver};  // NCCL groups (group/receiver_groups.hpp)
  ServerState state;
  Context context{receiver, options, groups, state};
  std::map<std::string, std::pair<const Entry*, HttpHandler>> handlers;  // by path
  HttpListener listener;
  int bound_port = -1;
  // The reaper of /update_weights_from_tensor's staged tensors (reap_staged_tensors).
  std::mutex reaper_mutex;
  std::condition_variable reaper_wake;
  bool reaper_stop = false;
  std::thread reaper;

  Impl(receiver::Receiver& r, ServerOptions o)
      : receiver(r),
        options(std::move(o)),
        listener(HttpLimits{}, [this](const HttpRequest& head) { return route(head); },
                 [](int status, ferry_status_code_t code, const std::string& message) {
                   return error_reply(status, status_name(code), message);
                 }) {}

  using Handler = HttpHandler;

  // Decides from the request's head alone, before any body byte is read: the route, its
  // method, the token.
  Dispatch route(const HttpRequest& head) {
    Dispatch d;
    auto it = handlers.find(head.path);
    if (it == handlers.end()) {
      d.answer = error_reply(404, status_name(FERRY_STATUS_NOT_FOUND),
                             "no route " + head.method + " " + head.path);
      return d;
    }
    const Entry& entry = *it->second.first;
    const Route& r = entry.route;
    if (!method_allowed(r.method, head.method)) {
      d.answer = error_reply(405, status_name(FERRY_STATUS_INVALID_ARGUMENT),
                             fmt::format("{} takes {}, not {}", r.path, r.method, head.method));
      d.answer->headers.emplace_back("Allow", r.method);
      return d;
    }
    if (r.mutating && !options.token.empty() && !token_matches(head.authorization, options.token)) {
      d.answer = error_reply(401, "UNAUTHENTICATED",
                             "this route needs 'Authorization: Bearer <token>'");
      d.answer->headers.emplace_back("WWW-Authenticate", "Bearer");
      return d;
    }
    d.handler = it->second.second;
    d.thread = entry.runs == Runs::io ? Dispatch::Thread::io
               : r.mutating           ? Dispatch::Thread::changes
                                      : Dispatch::Thread::reads;
    return d;
  }

  // Discards the tensors /update_weights_from_tensor calls staged for an update that no call
  // completed once their client sent nothing for update.staged_tensors_timeout_ms (a trainer
  // that died between calls), freeing their host memory; looks every second (or four times per
  // timeout when that is shorter).
  void reap_staged_tensors() {
    using namespace std::chrono;
    const milliseconds timeout(receiver.receiver_config().update.staged_tensors_timeout_ms);
    const milliseconds period = std::clamp<milliseconds>(timeout / 4, milliseconds(1),
                                                         milliseconds(1000));
    std::unique_lock lock(reaper_mutex);
    while (!reaper_wake.wait_for(lock, period, [&] { return reaper_stop; })) {
      lock.unlock();
      {
        std::lock_guard tensors(state.tensor_mutex);
        const std::size_t count = state.tensors.size();
        const std::uint64_t bytes = state.tensors.bytes();
        if (state.tensors.discard_if_idle(steady_clock::now(), timeout)) {
          logger("control")->warn(
              "update_weights_from_tensor: the update in progress ({} tensors, {:.1f} MiB "
              "written) was aborted: its client sent nothing for {} ms "
              "(update.staged_tensors_timeout_ms) and never completed it; the published version "
              "stays",
              count, static_cast<double>(bytes) / 1048576.0, timeout.count());
        }
      }
      lock.lock();
    }
  }

  void stop_reaper() {
    {
      std::lock_guard lock(reaper_mutex);
      reaper_stop = true;
    }
    reaper_wake.notify_all();
    if (reaper.joinable()) reaper.join();
  }

  // Wraps a handler with error translation: a request's own mistakes are 4xx, never 500.
  Handler wrap(const Route& route, Handler body) {
    return [&route, body](const HttpRequest& req) {
      try {
        return body(req);
      } catch (const Error& e) {
        logger("control")->warn("{} {}: {}", route.method, route.path, e.what());
        return reply_error(e.code(), e.what());
      } catch (const json::exception& e) {
        // A field of the request read as the wrong JSON type by a parser.
        logger("control")->warn("{} {}: {}", route.method, route.path, e.what());
        return reply_error(FERRY_STATUS_INVALID_ARGUMENT,
                           fmt::format("request body: {}", e.what()));
      } catch (const std::bad_alloc&) {
        logger("control")->error("{} {}: out of memory", route.method, route.path);
        return reply_error(FERRY_STATUS_OUT_OF_MEMORY,
                           fmt::format("{}: out of memory", route.path));
      } catch (const std::exception& e) {
        logger("control")->error("{} {}: {}", route.method, route.path, e.what());
        return reply_error(FERRY_STATUS_INTERNAL, e.what());
      }
    };
  }

  void install() {
    for (const Entry& entry : kTable) {
      handlers[entry.route.path] = {
          &entry, wrap(entry.route, [this, &entry](const HttpRequest& req) {
            return entry.handle(context, req);
          })};
    }
  }
};

ControlServer::ControlServer(receiver::Receiver& receiver, ServerOptions options)
    : impl_(std::make_unique<Impl>(receiver, std::move(options))) {
  impl_->install();
}

ControlServer::~ControlServer() { stop(); }

void ControlServer::start() {
  impl_->bound_port = impl_->listener.start(impl_->options.host, impl_->options.port);
  if (!impl_->reaper.joinable()) {
    impl_->reaper_stop = false;
    impl_->reaper = std::thread([impl = impl_.get()] { impl->reap_staged_tensors(); });
  }
  logger("control")->info("listening on http://{}:{}{}", impl_->options.host, impl_->bound_port,
                          impl_->options.token.empty() ? "" : " (token required for changes)");
}

void ControlServer::stop() {
  if (!impl_) return;
  impl_->listener.stop();
  impl_->stop_reaper();
}

int ControlServer::port() const { return impl_->bound_port; }

}  // namespace ferry::control
