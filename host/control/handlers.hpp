// control/handlers.hpp: what the route handlers of the control API share (internal to
// host/control): the context a handler runs in, JSON answers in SGLang's shape
// ({"success", "message", ...}; errors {"success": false, "message", "code"}), and the fields
// every body reads. The route table and the server are control/http_server.cpp; the handlers of
// the engine routes (pause, flush, weight-update session, infos, weights checker, memory)
// control/engine_routes.cpp.
#pragma once

#include <ferry/sdk/error.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "control/http_listener.hpp"
#include "control/http_server.hpp"
#include "control/tensor_update.hpp"
#include "group/receiver_groups.hpp"
#include "receiver/receiver.hpp"

namespace ferry::control {

using nlohmann::json;

// What the server remembers between requests: /weights_checker's snapshot (the published
// weights' fingerprints when it was taken), the path of the last disk update (/model_info) and
// vLLM's sleep (the tags still asleep, whether /sleep paused generation).
struct ServerState {
  std::mutex mutex;
  std::optional<std::map<std::string, std::uint64_t>> snapshot;
  std::string snapshot_version;
  std::string model_path;
  std::set<std::string> sleeping_tags;  // vLLM's names: "weights", "kv_cache", the engine's
  bool sleep_paused = false;            // /sleep paused generation: the last wake_up resumes it
  std::mutex sleep_mutex;               // one /sleep or /wake_up at a time
  std::mutex tensor_mutex;              // /update_weights_from_tensor's staged tensors
  PendingTensorUpdate tensors;
};

// What a route's handler may use: the receiver, the server's options, the NCCL groups and the
// server's state.
struct Context {
  receiver::Receiver& receiver;
  const ServerOptions& options;
  receiver::WeightUpdateGroups& groups;
  ServerState& state;
};

int http_status(ferry_status_code_t code);
HttpResponse reply(int status, const json& body);
// Every error answer, whatever produced it: {"success": false, "message", "code"}.
HttpResponse error_reply(int status, const std::string& code, const std::string& message);
HttpResponse reply_error(ferry_status_code_t code, const std::string& message);
// The request body as a JSON object; an empty body is an empty object.
json parse_body(const HttpRequest& req);
std::string required_string(const json& body, const char* key);
// SGLang accepts the weight version as a string; numbers are accepted and stringified.
std::optional<std::string> optional_label(const json& body, const char* key);
std::vector<std::string> tags_field(const json& body);
json report_json(const receiver::UpdateReport& r);

template <typename T>
T field(const json& body, const char* key, T fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann converts 3.7 to 3 silently: an integer field takes integers only.
    if (!it->is_number_integer()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be an integer (got {} {})", key,
           it->type_name(), it->dump());
    }
    const bool fits =
        it->is_number_unsigned()
            ? it->get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())
            : std::is_signed_v<T> || it->get<std::int64_t>() >= 0;
    if (!fits) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' is out of range ({})", key, it->dump());
    }
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' has the wrong type ({})", key, it->type_name());
  }
}

// An update with SGLang's effects around it (receiver/engine_control.hpp: abort_all_requests,
// flush_cache, post-load processing outside a weight-update session).
template <typename F>
receiver::UpdateReport with_effects(Context& c, const receiver::UpdateEffects& effects, F&& run) {
  receiver::UpdateReport report;
  c.receiver.engine_control().run_update(effects, [&] { report = run(); });
  return report;
}

// The engine routes (control/engine_routes.cpp).
HttpResponse pause_generation(Context& c, const HttpRequest& req);
HttpResponse continue_generation(Context& c, const HttpRequest& req);
HttpResponse flush_cache(Context& c, const HttpRequest& req);
HttpResponse begin_weight_update(Context& c, const HttpRequest& req);
HttpResponse end_weight_update(Context& c, const HttpRequest& req);
HttpResponse model_info(Context& c, const HttpRequest& req);
HttpResponse server_info(Context& c, const HttpRequest& req);
HttpResponse weights_checker(Context& c, const HttpRequest& req);
HttpResponse release_memory(Context& c, const HttpRequest& req);
HttpResponse resume_memory(Context& c, const HttpRequest& req);
// What the engine routes share with vLLM's (control/vllm_routes.cpp), one code path each:
// closes the weight-update session (the tensors it staged committed first, then post_load);
// returns the updates made in it. `route` names the route in errors.
std::uint64_t end_session(Context& c, const char* route);
// Releases (or resumes) `tags` (empty: all): the engine's tags through its callback, ferry's store
// tags through the receiver, kv_cache and cuda_graph without an engine as not held. Returns the
// answer of /release_memory_occupation.
json change_memory(Context& c, const std::vector<std::string>& tags, bool release);
// One update of every checkpoint tensor with random bytes, through the update loop (buckets in
// memory): the published weights are poisoned, so a later update that misses a tensor shows in a
// compare. Versioned "weights_checker:reset_tensors" and fingerprinted like any update.
receiver::UpdateReport reset_tensors(Context& c);
// vLLM's RL routes (control/vllm_routes.cpp).
HttpResponse vllm_pause(Context& c, const HttpRequest& req);
HttpResponse vllm_resume(Context& c, const HttpRequest& req);
HttpResponse vllm_is_paused(Context& c, const HttpRequest& req);
HttpResponse init_weight_transfer_engine(Context& c, const HttpRequest& req);
HttpResponse start_weight_update(Context& c, const HttpRequest& req);
HttpResponse vllm_update_weights(Context& c, const HttpRequest& req);
HttpResponse finish_weight_update(Context& c, const HttpRequest& req);
HttpResponse weight_info(Context& c, const HttpRequest& req);
HttpResponse weight_checker(Context& c, const HttpRequest& req);
HttpResponse vllm_sleep(Context& c, const HttpRequest& req);
HttpResponse vllm_wake_up(Context& c, const HttpRequest& req);
HttpResponse vllm_is_sleeping(Context& c, const HttpRequest& req);
// control/tensor_update.cpp: the route, and the commit of what a session staged.
HttpResponse update_from_tensor(Context& c, const HttpRequest& req);
std::optional<receiver::UpdateReport> commit_pending_tensors(Context& c);

}  // namespace ferry::control
