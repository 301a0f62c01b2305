// control/engine_routes.cpp: the SGLang routes about the engine around the weights: pause and
// continue generation, flush the cache, the weight-update session, /model_info, /server_info,
// /weights_checker and the memory tags (ferry's store tags and the engine's, such as kv_cache).
// `ferry serve` has no engine: these answer from the receiver's state (docs/http-api.md,
// "Engine routes").
#include <fmt/ranges.h>
#include <xxhash.h>
#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <cstring>
#include <random>

#include "config/config.hpp"
#include "control/handlers.hpp"
#include "control/requests.hpp"
#include "ferry_build_config.h"

namespace ferry::control {
namespace {

// SGLang's memory tags that belong to an engine, never to ferry's store. `ferry serve` holds
// neither: releasing them releases nothing and says so.
bool is_engine_side_tag(const std::string& tag) {
  return tag == "kv_cache" || tag == "cuda_graph";
}

json engine_json(const receiver::EngineControl& e) {
  const auto s = e.state();
  return json{
      {"registered", e.has_engine()},
      {"paused", s.paused},
      {"pause_mode", s.pause_mode ? json(receiver::pause_mode_name(*s.pause_mode)) : json()},
      {"weight_update_session", s.session_open},
      {"selector", s.session_open ? json(s.selector) : json()}};
}

}  // namespace

HttpResponse pause_generation(Context& c, const HttpRequest& req) {
  const auto mode = parse_pause_mode(parse_body(req));
  auto& engine = c.receiver.engine_control();
  const std::uint64_t paused = engine.pause(mode);
  return reply(200, json{{"success", true},
                         {"status", "ok"},
                         {"message", engine.has_engine()
                                         ? "Generation paused successfully."
                                         : "ferry serve runs no generation: nothing to pause"},
                         {"mode", receiver::pause_mode_name(mode)},
                         {"num_paused_requests", paused}});
}

HttpResponse continue_generation(Context& c, const HttpRequest& req) {
  const bool empty_cache = parse_continue_empty_cache(parse_body(req));
  auto& engine = c.receiver.engine_control();
  const bool was_paused = engine.resume(empty_cache);
  return reply(200, json{{"success", true},
                         {"status", "ok"},
                         {"message", !was_paused ? "Generation was not paused."
                                     : engine.has_engine()
                                         ? "Generation continued successfully."
                                         : "ferry serve runs no generation: nothing to continue"}});
}

HttpResponse flush_cache(Context& c, const HttpRequest&) {
  const bool flushed = c.receiver.engine_control().flush_cache(false);
  return reply(200,
               json{{"success", true},
                    {"message", flushed ? "Cache flushed."
                                        : "no engine cache to flush (ferry serve holds none)"}});
}

HttpResponse begin_weight_update(Context& c, const HttpRequest& req) {
  const std::string selector = parse_selector(parse_body(req));
  c.receiver.engine_control().begin_update(selector);
  return reply(
      200, json{{"success", true},
                {"message", fmt::format("weight-update session begun (selector '{}')", selector)},
                {"selector", selector}});
}

std::uint64_t end_session(Context& c, const char* route) {
  auto& engine = c.receiver.engine_control();
  std::uint64_t updates = engine.state().updates_in_session;
  // The tensors /update_weights_from_tensor staged in the session are one update, committed
  // first; when that fails the session still closes and the answer is the commit's error.
  try {
    if (commit_pending_tensors(c)) ++updates;
  } catch (const Error& e) {
    try {
      engine.end_update();
    } catch (const Error&) {
    }
    throw Error(e.code(), fmt::format("{}: the tensors staged in the session failed to commit "
                                      "(the session is closed, the published version stays): {}",
                                      route, e.what()));
  }
  engine.end_update();
  return updates;
}

HttpResponse end_weight_update(Context& c, const HttpRequest& req) {
  parse_body(req);  // a malformed body is still 400
  const std::uint64_t updates = end_session(c, "end_weight_update");
  return reply(
      200, json{{"success", true},
                {"message", fmt::format("weight-update session ended after {} updates", updates)},
                {"num_updates", updates},
                {"weight_version", c.receiver.version().label}});
}

HttpResponse model_info(Context& c, const HttpRequest&) {
  const auto& config = c.receiver.receiver_config();
  std::string model_path;
  {
    const std::lock_guard lock(c.state.mutex);
    model_path = c.state.model_path;
  }
  if (model_path.empty()) model_path = config.receiver.model_path;
  const auto v = c.receiver.version();
  return reply(200, json{{"model_path", model_path.empty() ? json() : json(model_path)},
                         {"weight_version", v.label},
                         {"version", v.number},
                         {"num_parameters", c.receiver.layout().size()},
                         {"model_family", config.receiver.model_family}});
}

HttpResponse server_info(Context& c, const HttpRequest&) {
  const auto& r = c.receiver.receiver_config().receiver;
  std::string model_path;
  {
    const std::lock_guard lock(c.state.mutex);
    model_path = c.state.model_path;
  }
  if (model_path.empty()) model_path = r.model_path;
  const auto v = c.receiver.version();
  const auto health = c.receiver.health();
  return reply(200, json{{"model_path", model_path.empty() ? json() : json(model_path)},
                         {"host", c.options.host},
                         {"port", c.options.port},
                         {"device", r.device},
                         {"tp_size", r.tp_size},
                         {"ep_size", r.ep_size},
                         {"weight_version", v.label},
                         {"version", FERRY_VERSION},
                         {"internal_states", json::array({json{{"tp_rank", r.tp_rank},
                                                               {"ep_rank", r.ep_rank},
                                                               {"weight_version", v.label},
                                                               {"state", health.state}}})},
                         {"ferry", json{{"version", FERRY_VERSION},
                                        {"published_version", v.number},
                                        {"model_family", r.model_family},
                                        {"engine", engine_json(c.receiver.engine_control())}}}});
}

namespace {

bool skipped(const std::string& name, const std::vector<std::string>& skip) {
  return std::any_of(skip.begin(), skip.end(),
                     [&](const std::string& s) { return name.find(s) != std::string::npos; });
}

std::map<std::string, std::uint64_t> checked_fingerprints(Context& c,
                                                          const std::vector<std::string>& skip) {
  auto prints = c.receiver.fingerprints();
  std::erase_if(prints, [&](const auto& kv) { return skipped(kv.first, skip); });
  return prints;
}

}  // namespace

receiver::UpdateReport reset_tensors(Context& c) {
  const auto catalog = c.receiver.checkpoint_catalog();
  if (catalog.empty()) fail(FERRY_STATUS_FAILED_PRECONDITION, "no weights loaded yet");
  std::vector<std::uint64_t> sizes;
  for (const auto& t : catalog) {
    std::uint64_t n = ferry::dtype_size(t.dtype);
    for (std::uint32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
    sizes.push_back(n);
  }
  const std::uint64_t capacity = c.receiver.receiver_config().update.bucket_bytes;
  const auto packing = sdk::pack_buckets(sizes, capacity);
  std::mt19937_64 random(std::random_device{}());
  const auto version = c.receiver.version().number + 1;
  std::vector<receiver::Receiver::Bucket> buckets;
  for (std::size_t b = 0; b < packing.buckets.size(); ++b) {
    const auto& pb = packing.buckets[b];
    receiver::Receiver::Bucket bucket;
    bucket.data.resize(pb.bytes);
    for (std::size_t i = 0; i + 8 <= bucket.data.size(); i += 8) {
      const std::uint64_t word = random();
      std::memcpy(bucket.data.data() + i, &word, 8);
    }
    manifest::Manifest m;
    m.version = version;
    m.bucket_index = static_cast<std::uint32_t>(b);
    m.bucket_count = static_cast<std::uint32_t>(packing.buckets.size());
    m.bucket_bytes = pb.bytes;
    for (std::size_t i = pb.first; i < pb.end; ++i) {
      manifest::Entry e;
      e.name = catalog[i].name;
      e.dtype = catalog[i].dtype;
      e.shape.assign(catalog[i].shape, catalog[i].shape + catalog[i].ndim);
      e.offset = packing.offsets[i];
      e.size = sizes[i];
      m.tensors.push_back(std::move(e));
    }
    bucket.manifest = manifest::encode(m);
    buckets.push_back(std::move(bucket));
  }
  return c.receiver.apply_update(buckets, version, "weights_checker:reset_tensors");
}

HttpResponse weights_checker(Context& c, const HttpRequest& req) {
  const auto check = parse_weights_check(parse_body(req));
  if (check.action == "checksum") {
    const auto prints = checked_fingerprints(c, check.skip_tensor_list);
    json checksums = json::object();
    std::string joined;  // sorted (std::map): name, NUL, checksum, LF
    for (const auto& [name, value] : prints) {
      const std::string hex = fmt::format("{:016x}", value);
      checksums[name] = hex;
      joined += name + '\0' + hex + '\n';
    }
    const auto& r = c.receiver.receiver_config().receiver;
    const json rank = {
        {"checksums", checksums},
        {"per_gpu_checksum", fmt::format("{:016x}", XXH64(joined.data(), joined.size(), 0))},
        {"parallelism_info", json{{"tp_rank", r.tp_rank},
                                  {"tp_size", r.tp_size},
                                  {"dp_rank", 0},
                                  {"dp_size", 1},
                                  {"pp_rank", 0},
                                  {"pp_size", 1},
                                  {"rank", r.tp_rank},
                                  {"size", r.tp_size}}}};
    return reply(200, json{{"success", true},
                           {"message", fmt::format("checksum of {} tensors", prints.size())},
                           {"ranks", json::array({rank})},
                           {"algorithm", manifest::kFingerprintAlgorithm},
                           {"weight_version", c.receiver.version().label}});
  }
  if (check.action == "snapshot") {
    auto prints = checked_fingerprints(c, {});
    const std::size_t n = prints.size();
    const std::lock_guard lock(c.state.mutex);
    c.state.snapshot = std::move(prints);
    c.state.snapshot_version = c.receiver.version().label;
    return reply(200, json{{"success", true},
                           {"message", fmt::format("snapshot of {} tensors at weight_version '{}'",
                                                   n, c.state.snapshot_version)}});
  }
  if (check.action == "compare") {
    std::map<std::string, std::uint64_t> expected;
    std::string taken_at;
    {
      const std::lock_guard lock(c.state.mutex);
      if (!c.state.snapshot) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "weights_checker compare: no snapshot taken (action 'snapshot' first)");
      }
      expected = *c.state.snapshot;
      taken_at = c.state.snapshot_version;
    }
    const auto actual = checked_fingerprints(c, check.skip_tensor_list);
    std::vector<std::string> differ;
    for (const auto& [name, value] : actual) {
      auto it = expected.find(name);
      if (it == expected.end() || it->second != value) differ.push_back(name);
    }
    std::size_t compared = actual.size();
    if (!differ.empty()) {
      const std::size_t shown = std::min<std::size_t>(differ.size(), 8);
      fail(FERRY_STATUS_ABORTED,
           "check tensor equality failed: {} of {} tensors differ from the snapshot taken at "
           "weight_version '{}' (fingerprints compared): {}{}",
           differ.size(), compared, taken_at,
           fmt::join(differ.begin(), differ.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
           differ.size() > shown ? ", ..." : "");
    }
    return reply(200, json{{"success", true},
                           {"message", fmt::format("{} tensors equal the snapshot taken at "
                                                   "weight_version '{}'",
                                                   compared, taken_at)}});
  }
  // reset_tensors
  if (!check.skip_tensor_list.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "weights_checker reset_tensors: skip_tensor_list is not supported (ferry's reset is one "
         "update covering every tensor)");
  }
  const auto report = reset_tensors(c);
  json out = report_json(report);
  out["success"] = true;
  out["message"] = fmt::format("{} tensors reset to random values (weight_version '{}')",
                               report.tensors, report.version.label);
  return reply(200, out);
}

json change_memory(Context& c, const std::vector<std::string>& tags, bool release) {
  auto& engine = c.receiver.engine_control();
  const auto engine_tags = engine.memory_tags();
  std::vector<std::string> store_tags, engine_chosen, not_held;
  for (const auto& t : tags) {
    if (std::find(engine_tags.begin(), engine_tags.end(), t) != engine_tags.end()) {
      engine_chosen.push_back(t);
    } else if (is_engine_side_tag(t)) {
      not_held.push_back(t);
    } else {
      store_tags.push_back(t);
    }
  }
  const bool all = tags.empty();
  if (all) engine_chosen = engine_tags;
  const bool touch_store = all || !store_tags.empty();
  if (touch_store && release && engine.state().session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "release_memory_occupation: the weights cannot be released while a weight-update "
         "session is open (end_weight_update first)");
  }
  // Release: the engine's memory first (its KV cache goes before the weights it reads);
  // resume: the weights first.
  if (release) engine.memory(engine_chosen, true);
  if (touch_store) {
    if (release) {
      c.receiver.release(store_tags);
    } else {
      c.receiver.resume(store_tags);
    }
  }
  if (!release) engine.memory(engine_chosen, false);
  json state = json::array();
  for (const auto& t : c.receiver.memory_state()) {
    state.push_back(json{{"tag", t.tag},
                         {"bytes", t.bytes},
                         {"released", t.released},
                         {"policy", t.policy},
                         {"contents_valid", t.contents_valid}});
  }
  std::string message = release ? "memory released" : "memory resumed";
  if (!not_held.empty()) {
    message += fmt::format(" ({}: none held here, nothing to {})", fmt::join(not_held, ", "),
                           release ? "release" : "resume");
  }
  return json{{"success", true},
              {"message", message},
              {"memory", state},
              {"engine_tags", engine_chosen},
              {"not_held", not_held}};
}

HttpResponse release_memory(Context& c, const HttpRequest& req) {
  return reply(200, change_memory(c, tags_field(parse_body(req)), true));
}

HttpResponse resume_memory(Context& c, const HttpRequest& req) {
  return reply(200, change_memory(c, tags_field(parse_body(req)), false));
}

}  // namespace ferry::control
