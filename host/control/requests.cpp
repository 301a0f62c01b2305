// control/requests.cpp: the JSON bodies (and vLLM's query parameters) of the control routes,
// checked (see requests.hpp).
#include "control/requests.hpp"

#include <fmt/format.h>

#include <ferry/sdk/error.hpp>

#include <cctype>
#include <cstdint>
#include <optional>
#include <vector>

#include "receiver/client_input.hpp"

namespace ferry::control {

std::optional<std::string> weight_version_field(const nlohmann::json& body) {
  const auto v = body.find("weight_version");
  if (v == body.end() || v->is_null()) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number_integer()) return std::to_string(v->get<long long>());
  fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'weight_version' must be a string");
}

namespace {

using nlohmann::json;

const json& required(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' is required", key);
  }
  return *it;
}

std::string string_field(const json& body, const char* key) {
  const json& v = required(body, key);
  if (!v.is_string() || v.get<std::string>().empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be a non-empty string", key);
  }
  // Addresses and names reach C strings (the plugin, NCCL): a NUL would cut them short.
  receiver::refuse_nul(v.get_ref<const std::string&>(), fmt::format("field '{}'", key));
  return v.get<std::string>();
}

std::uint64_t unsigned_field(const json& body, const char* key, std::uint64_t max) {
  const json& v = required(body, key);
  if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<unsigned long long>() > max) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be an integer from 0 to {}", key, max);
  }
  return v.get<std::uint64_t>();
}

std::optional<double> optional_seconds(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 86400) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be a number of seconds in (0, 86400]",
         key);
  }
  return it->get<double>();
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// SGLang's default group name when a request leaves it out.
constexpr const char* kDefaultGroupName = "weight_update_group";

std::string group_name_field(const json& body) {
  auto it = body.find("group_name");
  if (it == body.end() || it->is_null()) return kDefaultGroupName;
  return string_field(body, "group_name");
}

std::vector<std::string> string_list(const json& body, const char* key) {
  const json& v = required(body, key);
  if (!v.is_array()) fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be a list", key);
  std::vector<std::string> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}[{}] must be a string", key, i);
    }
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<std::vector<std::uint64_t>> shape_list(const json& body) {
  const json& v = required(body, "shapes");
  if (!v.is_array()) fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'shapes' must be a list of lists");
  std::vector<std::vector<std::uint64_t>> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_array()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "shapes[{}] must be a list of dims", i);
    }
    std::vector<std::uint64_t> shape;
    for (std::size_t d = 0; d < v[i].size(); ++d) {
      const json& dim = v[i][d];
      if (!dim.is_number_integer() || dim.get<long long>() < 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "shapes[{}][{}] must be a non-negative integer", i, d);
      }
      shape.push_back(dim.get<std::uint64_t>());
    }
    out.push_back(std::move(shape));
  }
  return out;
}

}  // namespace

std::string parse_group_name(const json& body) {
  return group_name_field(body);
}

std::chrono::milliseconds parse_destroy_timeout(const json& body) {
  if (auto t = optional_seconds(body, "timeout_s")) return to_ms(*t);
  return std::chrono::milliseconds(15000);
}

nccl::GroupInit parse_group_init(const json& body) {
  nccl::GroupInit init;
  init.master_address = string_field(body, "master_address");
  init.master_port = static_cast<std::uint16_t>(unsigned_field(body, "master_port", 65535));
  if (init.master_port == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'master_port' must be from 1 to 65535");
  }
  init.rank_offset = static_cast<std::uint32_t>(unsigned_field(body, "rank_offset", 1u << 20));
  init.world_size = static_cast<std::uint32_t>(unsigned_field(body, "world_size", 1u << 20));
  init.group_name = group_name_field(body);
  if (auto it = body.find("backend"); it != body.end() && !it->is_null()) {
    init.backend = string_field(body, "backend");
  }
  if (auto t = optional_seconds(body, "timeout_s")) init.init_timeout = to_ms(*t);
  init.rank = init.rank_offset;
  if (init.rank_offset == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "field 'rank_offset' must be >= 1: rank 0 of a weight-update group is the trainer");
  }
  nccl::check_group_init(init);
  return init;
}

namespace {

// The tensors of a broadcast update, in rank 0's order: SGLang names the dtypes `dtypes`, vLLM
// `dtype_names`. Read in field order, so a request missing several fields is told the first.
std::vector<nccl::TensorSpec> broadcast_tensors(const json& body, const char* dtypes_key) {
  const auto names = string_list(body, "names");
  const auto dtypes = string_list(body, dtypes_key);
  const auto shapes = shape_list(body);
  return nccl::make_tensor_specs(names, dtypes, shapes);
}

}  // namespace

receiver::DistributedUpdate parse_distributed_update(const json& body) {
  static constexpr const char* kRoute = "update_weights_from_distributed";
  receiver::DistributedUpdate update;
  update.tensors = broadcast_tensors(body, "dtypes");
  update.group_name = group_name_field(body);
  update.weight_version = weight_version_field(body);
  update.effects = parse_update_effects(body, kRoute);
  if (auto it = body.find("load_format"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'load_format' must be a string");
    // SGLang's "flattened_bucket": the whole list as one unaligned byte tensor (a torch
    // trainer's group; WeightUpdateGroups::update refuses it for ferry's own rank 0).
    if (it->get<std::string>() != "flattened_bucket") {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: load_format '{}' is not supported (null: one broadcast per tensor, or ferry's "
           "bucketed layout from ferry's rank 0; 'flattened_bucket': one broadcast of all)",
           kRoute, it->get<std::string>());
    }
    update.flattened = true;
  }
  if (auto it = body.find("bucket_bytes"); it != body.end() && !it->is_null()) {
    update.bucket_bytes = unsigned_field(body, "bucket_bytes", nccl::kMaxBucketBytes);
    nccl::check_bucket_bytes(update.bucket_bytes);
  }
  if (auto t = optional_seconds(body, "timeout_s")) update.bucket_timeout = to_ms(*t);
  return update;
}

receiver::IpcUpdateRequest parse_ipc_update(const json& body) {
  receiver::IpcUpdateRequest request;
  auto it = body.find("zmq_handles");
  if (it == body.end() || it->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'zmq_handles' is required");
  }
  if (!it->is_object() || it->empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "field 'zmq_handles' must be a non-empty object of GPU UUID -> ZMQ address");
  }
  for (const auto& [uuid, address] : it->items()) {
    if (uuid.empty() || !address.is_string() || address.get<std::string>().empty()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "zmq_handles['{}'] must be a non-empty address string",
           uuid);
    }
    // The address reaches ZeroMQ as a C string: a NUL would cut it short (another socket).
    receiver::refuse_nul(address.get_ref<const std::string&>(),
                         fmt::format("zmq_handles['{}']", uuid));
    request.zmq_handles[uuid] = address.get<std::string>();
  }
  request.effects = parse_update_effects(body, "update_weights_from_ipc");
  request.weight_version = weight_version_field(body);
  request.timeout_s = optional_seconds(body, "timeout_s");
  return request;
}

namespace {

bool optional_bool(const json& body, const char* key, bool fallback, const char* route) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field '{}' must be a boolean", route, key);
  return it->get<bool>();
}

std::optional<std::string> optional_string(const json& body, const char* key, const char* route) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string())
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field '{}' must be a string", route, key);
  return it->get<std::string>();
}

}  // namespace

receiver::UpdateEffects parse_update_effects(const json& body, const char* route) {
  receiver::UpdateEffects e;
  e.flush_cache = optional_bool(body, "flush_cache", true, route);
  e.torch_empty_cache = optional_bool(body, "torch_empty_cache", false, route);
  e.abort_all_requests = optional_bool(body, "abort_all_requests", false, route);
  return e;
}

DiskUpdateRequest parse_disk_update(const json& body) {
  static constexpr const char* kRoute = "update_weights_from_disk";
  DiskUpdateRequest r;
  auto it = body.find("model_path");
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'model_path' (non-empty string) is required");
  }
  r.model_path = it->get<std::string>();
  r.weight_version = weight_version_field(body);
  if (auto f = optional_string(body, "load_format", kRoute);
      f && *f != "auto" && *f != "safetensors") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: load_format '{}' is not one ferry loads (null, 'auto' or 'safetensors': ferry reads "
         "safetensors checkpoints)",
         kRoute, *f);
  }
  r.effects = parse_update_effects(body, kRoute);
  r.effects.keep_pause = optional_bool(body, "keep_pause", false, kRoute);
  optional_bool(body, "is_async", false, kRoute);
  optional_bool(body, "recapture_cuda_graph", false, kRoute);
  if (auto t = body.find("token_step");
      t != body.end() && !t->is_null() && !t->is_number_integer()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field 'token_step' must be an integer", kRoute);
  }
  if (auto m = body.find("manifest"); m != body.end() && !m->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: field 'manifest' (a partial load of named tensors) is not supported: ferry loads "
         "the whole checkpoint at model_path",
         kRoute);
  }
  return r;
}

receiver::PauseMode parse_pause_mode(const json& body) {
  const auto mode = optional_string(body, "mode", "pause_generation").value_or("abort");
  if (mode == "abort") return receiver::PauseMode::abort;
  if (mode == "retract") return receiver::PauseMode::retract;
  if (mode == "in_place") return receiver::PauseMode::in_place;
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "pause_generation: mode '{}' is not one of abort, retract, in_place", mode);
}

bool parse_continue_empty_cache(const json& body) {
  return optional_bool(body, "torch_empty_cache", true, "continue_generation");
}

std::string parse_selector(const json& body) {
  return optional_string(body, "selector", "begin_weight_update").value_or("all");
}

WeightsCheckRequest parse_weights_check(const json& body) {
  static constexpr const char* kRoute = "weights_checker";
  WeightsCheckRequest r;
  r.action = optional_string(body, "action", kRoute).value_or("checksum");
  if (r.action != "checksum" && r.action != "snapshot" && r.action != "reset_tensors" &&
      r.action != "compare") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: action '{}' is not one of checksum, snapshot, reset_tensors, compare", kRoute,
         r.action);
  }
  optional_bool(body, "allow_quant_error", false, kRoute);
  if (auto it = body.find("skip_tensor_list"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field 'skip_tensor_list' must be a list of strings",
           kRoute);
    }
    for (const auto& s : *it) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "{}: field 'skip_tensor_list' must be a list of non-empty strings", kRoute);
      }
      r.skip_tensor_list.push_back(s.get<std::string>());
    }
  }
  return r;
}

// ---- vLLM's RL routes ---------------------------------------------------------------------

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] != '%') {
      out += text[i];
    } else {
      const int hi = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
      const int lo = hi >= 0 ? hex_digit(text[i + 2]) : -1;
      if (lo < 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "query '{}': a '%' not followed by two hex digits",
             text);
      }
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    }
  }
  receiver::refuse_nul(out, "a query parameter");
  return out;
}

// The last value of `key` (FastAPI's scalar query parameters take the last one), or nullopt.
std::optional<std::string> query_value(const QueryParams& query, const char* key) {
  std::optional<std::string> value;
  for (const auto& [k, v] : query) {
    if (k == key) value = v;
  }
  return value;
}

// FastAPI's (pydantic's) spellings of a boolean query parameter.
bool query_bool(const QueryParams& query, const char* key, bool fallback, const char* route) {
  const auto v = query_value(query, key);
  if (!v) return fallback;
  std::string lower = *v;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* yes : {"true", "1", "yes", "on", "t", "y"}) {
    if (lower == yes) return true;
  }
  for (const char* no : {"false", "0", "no", "off", "f", "n"}) {
    if (lower == no) return false;
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "{}: query parameter '{}' must be a boolean (true or false), "
       "not '{}'",
       route, key, *v);
}

// A JSON object of non-empty key -> non-empty string (a checksum answer). `what` names it.
Checksums checksum_object(const json& v, const std::string& what) {
  if (!v.is_object()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} must be an object of tensor key -> checksum string",
         what);
  }
  Checksums out;
  for (const auto& [key, digest] : v.items()) {
    if (key.empty() || !digest.is_string() || digest.get<std::string>().empty()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}['{}'] must be a non-empty checksum string", what,
           key);
    }
    out[key] = digest.get<std::string>();
  }
  return out;
}

}  // namespace

QueryParams parse_query(std::string_view query) {
  QueryParams out;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (!pair.empty()) {
      const auto eq = pair.find('=');
      out.emplace_back(
          percent_decoded(pair.substr(0, eq)),
          eq == std::string_view::npos ? std::string() : percent_decoded(pair.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return out;
}

nccl::GroupInit parse_weight_transfer_init(const json& body) {
  static constexpr const char* kRoute = "init_weight_transfer_engine";
  const auto it = body.find("init_info");
  if (it == body.end() || it->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field 'init_info' is required", kRoute);
  }
  if (!it->is_object()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: field 'init_info' must be an object (NCCL: master_address, master_port, "
         "rank_offset, world_size)",
         kRoute);
  }
  try {
    return parse_group_init(*it);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: init_info: {}", kRoute, e.what()));
  }
}

void parse_start_weight_update(const json& body) {
  if (optional_bool(body, "include_draft", false, "start_weight_update")) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "start_weight_update: include_draft true: ferry holds no draft model (only the target)");
  }
}

receiver::DistributedUpdate parse_weights_update(const json& body, std::uint32_t tp_rank,
                                                 std::uint32_t tp_size) {
  static constexpr const char* kRoute = "update_weights";
  const auto it = body.find("update_info");
  if (it == body.end() || it->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: field 'update_info' is required", kRoute);
  }
  const json* info = &*it;
  std::string where = "update_info";
  if (info->is_array()) {
    // vLLM's per-worker form: one object per worker of the engine; this receiver is tp_rank.
    if (info->size() != tp_size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: field 'update_info' is a list of {} entries: it must hold one per worker, {} "
           "(receiver.tp_size)",
           kRoute, info->size(), tp_size);
    }
    where = fmt::format("update_info[{}]", tp_rank);
    info = &(*info)[tp_rank];
  }
  if (!info->is_object()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: field '{}' must be an object (NCCL: names, dtype_names, shapes, packed)", kRoute,
         where);
  }
  try {
    receiver::DistributedUpdate update;
    update.tensors = broadcast_tensors(*info, "dtype_names");
    update.group_name = kDefaultGroupName;
    update.effects.flush_cache = false;
    optional_bool(*info, "packed", false, kRoute);
    // The other side is ferry's rank 0 (a vLLM trainer does not speak ferry's rendezvous): a
    // request without packed_buffer_size_bytes means that trainer's default bucket size, not
    // vLLM's 1 GiB.
    update.bucket_bytes = nccl::kDefaultBucketBytes;
    if (auto b = info->find("packed_buffer_size_bytes"); b != info->end() && !b->is_null()) {
      update.bucket_bytes =
          unsigned_field(*info, "packed_buffer_size_bytes", nccl::kMaxBucketBytes);
      nccl::check_bucket_bytes(update.bucket_bytes);
    }
    if (auto n = info->find("packed_num_buffers"); n != info->end() && !n->is_null()) {
      if (unsigned_field(*info, "packed_num_buffers", 64) == 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'packed_num_buffers' must be at least 1");
      }
    }
    if (auto t = optional_seconds(*info, "timeout_s")) update.bucket_timeout = to_ms(*t);
    return update;
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}: {}", kRoute, where, e.what()));
  }
}

FinishWeightUpdateRequest parse_finish_weight_update(const json& body) {
  FinishWeightUpdateRequest r;
  r.weight_version = weight_version_field(body);
  if (auto b = body.find("baseline"); b != body.end() && !b->is_null()) {
    r.baseline = checksum_object(*b, "finish_weight_update: field 'baseline'");
  }
  return r;
}

VllmPauseRequest parse_vllm_pause(const QueryParams& query, const char* route) {
  VllmPauseRequest r;
  r.mode = query_value(query, "mode").value_or("abort");
  if (r.mode != "abort" && r.mode != "wait" && r.mode != "keep") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: query parameter 'mode' is '{}', not one of abort, wait, keep", route, r.mode);
  }
  if (query_bool(query, "wait_for_inflight_requests", false, route)) r.mode = "wait";
  r.clear_cache = query_bool(query, "clear_cache", true, route);
  return r;
}

SleepRequest parse_sleep(const QueryParams& query) {
  SleepRequest r;
  const auto level = query_value(query, "level").value_or("1");
  if (level != "1" && level != "2") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "sleep: query parameter 'level' is '{}', not 1 (weights kept in host memory) or 2 "
         "(weights dropped)",
         level);
  }
  r.level = level == "1" ? 1 : 2;
  r.pause = parse_vllm_pause(query, "sleep");
  return r;
}

std::vector<std::string> parse_wake_up_tags(const QueryParams& query) {
  std::vector<std::string> tags;
  for (const auto& [k, v] : query) {
    if (k != "tags") continue;
    if (v.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "wake_up: query parameter 'tags' is empty");
    tags.push_back(v);
  }
  return tags;
}

WeightCheckerRequest parse_weight_checker(const json& body) {
  static constexpr const char* kRoute = "weight_checker";
  WeightCheckerRequest r;
  r.action = optional_string(body, "action", kRoute).value_or("");
  if (r.action != "checksum" && r.action != "reset" && r.action != "compare") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: field 'action' must be one of checksum, reset, compare (got '{}')", kRoute, r.action);
  }
  if (r.action != "compare") return r;
  const auto b = body.find("baseline");
  if (b == body.end() || b->is_null()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: action 'compare' requires field 'baseline'", kRoute);
  }
  r.baseline = checksum_object(*b, "weight_checker: field 'baseline'");
  if (auto c = body.find("checksums"); c != body.end() && !c->is_null()) {
    if (!c->is_array()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: field 'checksums' must be a list of checksum answers", kRoute);
    }
    for (std::size_t i = 0; i < c->size(); ++i) {
      r.reports.push_back(checksum_object((*c)[i], fmt::format("{}: checksums[{}]", kRoute, i)));
    }
  }
  return r;
}

}  // namespace ferry::control
