// control/vllm_routes.cpp: vLLM's RL routes (its dev-mode rlhf and sleep routers: pause, resume,
// the weight-transfer engine and its start / update / finish protocol, the weight version, the
// weight checker, sleep and wake-up), mapped onto what the SGLang routes already do, one code path
// per behaviour: the NCCL weight-update group, the weight-update session, the engine callbacks,
// the memory tags and the fingerprints. Field names, defaults and answer shapes are vLLM's
// (docs/http-api.md, "vLLM's RL routes").
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "common/log.hpp"
#include "config/config.hpp"
#include "control/handlers.hpp"
#include "control/requests.hpp"

namespace ferry::control {
namespace {

// vLLM's routes that answer no content (/sleep, /wake_up) answer an empty 200.
HttpResponse no_content() {
  HttpResponse res;
  res.content_type = "text/plain; charset=utf-8";
  return res;
}

// vLLM's pause modes onto the engine callbacks' (SGLang's): abort -> abort, keep -> in_place (the
// requests stay where they are, KV cache included, and go on at /resume). "wait" (the running
// requests finish first) has no callback mode: nullopt.
std::optional<receiver::PauseMode> engine_pause_mode(const std::string& mode) {
  if (mode == "abort") return receiver::PauseMode::abort;
  if (mode == "keep") return receiver::PauseMode::in_place;
  return std::nullopt;
}

// Stops generation as vLLM's /pause does (and /sleep before it releases memory), then flushes the
// engine's caches when clear_cache (not for "keep": the frozen requests still need them).
void pause_engine(Context& c, const VllmPauseRequest& p, const char* route) {
  auto& engine = c.receiver.engine_control();
  auto mode = engine_pause_mode(p.mode);
  if (!mode) {
    if (engine.has_engine()) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "{}: mode 'wait' (let the running requests finish, then pause) is not one the "
           "engine's pause callback offers (abort, retract, in_place): use mode abort or keep",
           route);
    }
    mode = receiver::PauseMode::in_place;  // ferry serve runs no requests: none to wait for
  }
  engine.pause(*mode);
  if (p.clear_cache && p.mode != "keep") engine.flush_cache(false);
}

// vLLM's checksum keys: "dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:ep{ep}:" before the parameter name (a
// ferry receiver is one rank: dp, pp and pcp 0).
std::string rank_prefix(const Context& c) {
  const auto& r = c.receiver.receiver_config().receiver;
  return fmt::format("dp0:pp0:pcp0:tp{}:ep{}:", r.tp_rank, r.ep_rank);
}

// vLLM's split of a key (vllm/utils/weight_checksum_utils.py): the prefix is the text up to the
// fifth colon; a key with fewer colons has none.
std::string key_prefix(const std::string& key) {
  std::size_t at = 0;
  for (int colons = 0; colons < 5; ++colons) {
    at = key.find(':', at);
    if (at == std::string::npos) return "";
    ++at;
  }
  return key.substr(0, at);
}

// The published weights' fingerprints (docs/fingerprint.md) under vLLM's rank-qualified keys.
Checksums current_checksums(Context& c) {
  const std::string prefix = rank_prefix(c);
  Checksums out;
  for (const auto& [name, value] : c.receiver.fingerprints()) {
    out[prefix + name] = fmt::format("{:016x}", value);
  }
  return out;
}

struct Comparison {
  bool match = true;
  std::vector<std::string> mismatches;  // keys some report lacks or reports disagree on, sorted
  std::vector<std::string> ranks;       // the rank prefixes the reports covered, sorted
};

// vLLM's compare_weight_checksum_reports: every key must be in every report with one digest.
// A bare parameter name in a report is this receiver's (SGLang's /weights_checker answers them).
Comparison compare_reports(Context& c, std::vector<Checksums> reports) {
  const std::string own = rank_prefix(c);
  std::map<std::string, std::map<std::size_t, std::string>> observed;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    for (const auto& [key, digest] : reports[i]) {
      observed[key_prefix(key).empty() ? own + key : key][i] = digest;
    }
  }
  Comparison out;
  std::set<std::string> ranks;
  for (const auto& [key, digests] : observed) {
    ranks.insert(key_prefix(key));
    std::set<std::string> distinct;
    for (const auto& [i, d] : digests) distinct.insert(d);
    if (digests.size() != reports.size() || distinct.size() > 1) out.mismatches.push_back(key);
  }
  out.match = out.mismatches.empty();
  out.ranks.assign(ranks.begin(), ranks.end());
  return out;
}

std::string first_keys(const std::vector<std::string>& keys) {
  const std::size_t shown = std::min<std::size_t>(keys.size(), 8);
  return fmt::format(
      "{}{}", fmt::join(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      keys.size() > shown ? ", ..." : "");
}

}  // namespace

HttpResponse vllm_pause(Context& c, const HttpRequest& req) {
  parse_body(req);  // vLLM reads no body; a malformed one is still 400
  pause_engine(c, parse_vllm_pause(parse_query(req.query)), "pause");
  return reply(200, json{{"status", "paused"}});
}

HttpResponse vllm_resume(Context& c, const HttpRequest& req) {
  parse_body(req);
  c.receiver.engine_control().resume(false);
  return reply(200, json{{"status", "resumed"}});
}

HttpResponse vllm_is_paused(Context& c, const HttpRequest&) {
  return reply(200, json{{"is_paused", c.receiver.engine_control().state().paused}});
}

HttpResponse init_weight_transfer_engine(Context& c, const HttpRequest& req) {
  c.groups.init(parse_weight_transfer_init(parse_body(req)));
  return reply(200, json{{"message", "Weight transfer initialized"}});
}

HttpResponse start_weight_update(Context& c, const HttpRequest& req) {
  parse_start_weight_update(parse_body(req));
  auto& engine = c.receiver.engine_control();
  if (engine.state().session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "start_weight_update called while a weight update is already in progress "
         "(finish_weight_update first)");
  }
  engine.begin_update("target");
  return reply(200, json{{"message", "Weight update started"}});
}

HttpResponse vllm_update_weights(Context& c, const HttpRequest& req) {
  const auto& r = c.receiver.receiver_config().receiver;
  auto update = parse_weights_update(parse_body(req), r.tp_rank, r.tp_size);
  if (!c.receiver.engine_control().state().session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "update_weights called without a preceding start_weight_update");
  }
  // vLLM's update_weights leaves the weight version as it is; finish_weight_update sets it.
  if (const auto label = c.receiver.version().label; !label.empty()) update.weight_version = label;
  try {
    with_effects(c, update.effects, [&] { return c.groups.update(update); });
  } catch (const Error& e) {
    if (e.code() != FERRY_STATUS_NOT_FOUND) throw;
    throw Error(e.code(), fmt::format("update_weights: no weight transfer engine: call "
                                      "/init_weight_transfer_engine first ({})",
                                      e.what()));
  }
  return reply(200, json{{"message", "Weights updated"}});
}

HttpResponse finish_weight_update(Context& c, const HttpRequest& req) {
  static constexpr const char* kRoute = "finish_weight_update";
  const auto request = parse_finish_weight_update(parse_body(req));
  if (!c.receiver.engine_control().state().session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "finish_weight_update called without a preceding start_weight_update");
  }
  end_session(c, kRoute);
  if (request.baseline) {
    const auto result = compare_reports(c, {*request.baseline, current_checksums(c)});
    if (!result.match) {
      fail(FERRY_STATUS_ABORTED,
           "{}: the session closed and its updates are published, but {} checksums differ from "
           "the baseline (a key missing on one side counts): {}; weight_version stays '{}'",
           kRoute, result.mismatches.size(), first_keys(result.mismatches),
           c.receiver.version().label);
    }
  }
  if (request.weight_version) c.receiver.set_version_label(*request.weight_version);
  return reply(200, json{{"message", "Weight update finished"}});
}

HttpResponse weight_info(Context& c, const HttpRequest&) {
  return reply(200, json{{"weight_version", c.receiver.version().label}});
}

HttpResponse weight_checker(Context& c, const HttpRequest& req) {
  const auto check = parse_weight_checker(parse_body(req));
  if (check.action == "reset") {
    reset_tensors(c);
    return reply(200, json{{"status", "reset"}});
  }
  if (check.action == "checksum") return reply(200, json{{"checksums", current_checksums(c)}});
  std::vector<Checksums> reports{check.baseline, current_checksums(c)};
  reports.insert(reports.end(), check.reports.begin(), check.reports.end());
  const auto result = compare_reports(c, std::move(reports));
  return reply(
      200,
      json{{"match", result.match}, {"mismatches", result.mismatches}, {"ranks", result.ranks}});
}

HttpResponse vllm_sleep(Context& c, const HttpRequest& req) {
  parse_body(req);
  const auto request = parse_sleep(parse_query(req.query));
  const std::lock_guard one_at_a_time(c.state.sleep_mutex);
  {
    const std::lock_guard lock(c.state.mutex);
    if (!c.state.sleeping_tags.empty()) {
      // vLLM's executor: "already sleeping" is a warning, and nothing changes.
      logger("control")->warn("sleep: already asleep ({}), nothing done",
                              fmt::join(c.state.sleeping_tags, ", "));
      return no_content();
    }
  }
  if (request.level == 1 &&
      c.receiver.receiver_config().memory.weights_policy != config::ReleasePolicy::backup) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "sleep: level 1 keeps the weights in host memory, but this receiver's "
         "memory.weights_policy is 'discard' (a release drops them): sleep with level=2, or "
         "configure weights_policy = \"backup\"");
  }
  auto& engine = c.receiver.engine_control();
  const bool was_paused = engine.state().paused;
  pause_engine(c, request.pause, "sleep");
  try {
    change_memory(c, {}, true);  // every tag: the engine's (kv_cache) first, then ferry's store
  } catch (...) {
    if (!was_paused) {
      try {
        engine.resume(false);
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  std::set<std::string> asleep{"weights", "kv_cache"};
  for (const auto& t : engine.memory_tags()) asleep.insert(t);
  const std::lock_guard lock(c.state.mutex);
  c.state.sleeping_tags = std::move(asleep);
  c.state.sleep_paused = !was_paused;
  return no_content();
}

HttpResponse vllm_wake_up(Context& c, const HttpRequest& req) {
  parse_body(req);
  auto tags = parse_wake_up_tags(parse_query(req.query));
  const std::lock_guard one_at_a_time(c.state.sleep_mutex);
  std::set<std::string> asleep;
  bool paused_by_sleep = false;
  {
    const std::lock_guard lock(c.state.mutex);
    asleep = c.state.sleeping_tags;
    paused_by_sleep = c.state.sleep_paused;
  }
  // vLLM's executor: waking an engine that is not asleep, or a tag that is not, is a warning and
  // changes nothing.
  if (asleep.empty()) {
    logger("control")->warn("wake_up: not asleep, nothing done");
    return no_content();
  }
  if (tags.empty()) tags.assign(asleep.begin(), asleep.end());
  for (const auto& t : tags) {
    if (asleep.count(t) == 0) {
      logger("control")->warn("wake_up: tag '{}' is not asleep ({}), nothing done", t,
                              fmt::join(asleep, ", "));
      return no_content();
    }
  }
  // vLLM's "weights" are ferry's store tags (weights, and staging for the next update).
  std::vector<std::string> resume;
  for (const auto& t : tags) {
    if (t != "weights") {
      resume.push_back(t);
      continue;
    }
    for (const auto& state : c.receiver.memory_state()) {
      if (state.released) resume.push_back(state.tag);
    }
  }
  if (!resume.empty()) change_memory(c, resume, false);
  for (const auto& t : tags) asleep.erase(t);
  if (asleep.empty() && paused_by_sleep) c.receiver.engine_control().resume(false);
  const std::lock_guard lock(c.state.mutex);
  c.state.sleeping_tags = std::move(asleep);
  if (c.state.sleeping_tags.empty()) c.state.sleep_paused = false;
  return no_content();
}

HttpResponse vllm_is_sleeping(Context& c, const HttpRequest&) {
  const std::lock_guard lock(c.state.mutex);
  return reply(200, json{{"is_sleeping", !c.state.sleeping_tags.empty()}});
}

}  // namespace ferry::control
