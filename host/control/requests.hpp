// control/requests.hpp: the JSON bodies of the control routes, checked and turned into the
// requests the receiver and its groups act on (receiver/, group/ parse no JSON). One parser per
// body, shared by the HTTP server (control/http_server.cpp) and the C API (host/capi), so each
// rule is stated once. Every refusal is INVALID_ARGUMENT naming the field (or tensor).
//
// Threading: pure functions, any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "group/receiver_groups.hpp"
#include "receiver/engine_control.hpp"
#include "receiver/receiver_ckpt.hpp"

namespace ferry::control {

// weight_version of a request: absent or null as nullopt, a string, or an integer as its decimal
// text. INVALID_ARGUMENT otherwise.
std::optional<std::string> weight_version_field(const nlohmann::json& body);

// group_name of a request; SGLang's default "weight_update_group" when absent. INVALID_ARGUMENT
// when present but not a non-empty string.
std::string parse_group_name(const nlohmann::json& body);

// POST /destroy_weights_update_group: ferry's optional timeout_s (how long the destroy may take,
// default 15). INVALID_ARGUMENT when it is not a number of seconds in (0, 86400].
std::chrono::milliseconds parse_destroy_timeout(const nlohmann::json& body);

// POST /init_weights_update_group: master_address, master_port, rank_offset (>= 1: rank 0 is the
// trainer), world_size, group_name, backend ("nccl", the default), and ferry's optional
// timeout_s (rendezvous + init, default 120). `rank` is rank_offset
// (WeightUpdateGroups::init adds the receiver's tp rank).
nccl::GroupInit parse_group_init(const nlohmann::json& body);

// POST /update_weights_from_distributed: names, dtypes, shapes (parallel lists), group_name,
// weight_version (optional), flush_cache and abort_all_requests (booleans), and ferry's optional
// bucket_bytes and timeout_s (per bucket).
receiver::DistributedUpdate parse_distributed_update(const nlohmann::json& body);

// POST /update_weights_from_ipc: zmq_handles (object of non-empty strings), flush_cache,
// torch_empty_cache, abort_all_requests (booleans), weight_version (string or integer),
// timeout_s.
receiver::IpcUpdateRequest parse_ipc_update(const nlohmann::json& body);

// The SGLang fields around an update (disk, distributed, tensor, IPC): flush_cache (default
// true), torch_empty_cache, abort_all_requests (booleans, default false). `route` names the
// route in errors.
receiver::UpdateEffects parse_update_effects(const nlohmann::json& body, const char* route);

struct DiskUpdateRequest {
  std::string model_path;
  std::optional<std::string> weight_version;
  receiver::UpdateEffects effects;
};

// POST /update_weights_from_disk: model_path (required), weight_version, load_format (null,
// "auto" or "safetensors"; any other is refused naming it), the update effects, keep_pause,
// is_async (the answer comes after the update either way), recapture_cuda_graph (ferry writes
// in place: captured addresses stay valid), token_step (integer, a sampling label ferry has no
// use for) and manifest (refused unless null: ferry loads whole checkpoints).
DiskUpdateRequest parse_disk_update(const nlohmann::json& body);

// POST /pause_generation: mode "abort" (the default), "retract" or "in_place".
receiver::PauseMode parse_pause_mode(const nlohmann::json& body);
// POST /continue_generation: torch_empty_cache (default true, SGLang's).
bool parse_continue_empty_cache(const nlohmann::json& body);
// POST /begin_weight_update: selector (default "all"; EngineControl::begin_update checks it).
std::string parse_selector(const nlohmann::json& body);

struct WeightsCheckRequest {
  std::string action;                         // checksum, snapshot, reset_tensors, compare
  std::vector<std::string> skip_tensor_list;  // substrings: tensors whose name contains one
};
// POST /weights_checker: action (default "checksum"), allow_quant_error (boolean; ferry's
// comparison is bit-exact either way, since it has no quantized weights to tolerate),
// skip_tensor_list (list of strings).
WeightsCheckRequest parse_weights_check(const nlohmann::json& body);

// ---- vLLM's RL routes (vLLM's vllm/entrypoints/serve/dev/rlhf and dev/sleep routers) ----------

// A request target's query ("level=1&mode=abort"), split at '&' and '=' and percent-decoded ('+'
// is a space), in order: a key may repeat (/wake_up?tags=weights&tags=kv_cache).
// INVALID_ARGUMENT for a bad %-escape or a decoded NUL.
using QueryParams = std::vector<std::pair<std::string, std::string>>;
QueryParams parse_query(std::string_view query);

// POST /init_weight_transfer_engine: init_info (required object), vLLM's NCCL init info:
// master_address, master_port, rank_offset, world_size, read as parse_group_init reads them
// (group_name, backend and ferry's timeout_s too). Errors are prefixed with the route and
// "init_info".
nccl::GroupInit parse_weight_transfer_init(const nlohmann::json& body);

// POST /start_weight_update: include_draft (boolean, default false); true is INVALID_ARGUMENT:
// ferry holds no draft model.
void parse_start_weight_update(const nlohmann::json& body);

// POST /update_weights: update_info (required), one object or one per worker (a list of tp_size
// objects; this receiver reads entry tp_rank), vLLM's NCCL update info: names, dtype_names,
// shapes (parallel lists), packed (boolean, default false), packed_buffer_size_bytes (ferry's
// bucket_bytes: equal on both sides; default nccl::kDefaultBucketBytes), packed_num_buffers
// (integer >= 1; ferry's receiver double-buffers whatever it says) and ferry's timeout_s (per
// bucket). The group is the default one; no update effects (vLLM's update_weights flushes
// nothing); weight_version is left unset for the route to fill.
receiver::DistributedUpdate parse_weights_update(const nlohmann::json& body, std::uint32_t tp_rank,
                                                 std::uint32_t tp_size);

// Weight checksums by key (vLLM's rank-qualified "dp0:pp0:pcp0:tp0:ep0:<name>", or a bare
// parameter name), 16 hex digits each in ferry's answers.
using Checksums = std::map<std::string, std::string>;

struct FinishWeightUpdateRequest {
  std::optional<std::string> weight_version;  // published after the session closed (vLLM's)
  std::optional<Checksums> baseline;          // ferry's: the weights must match it
};
// POST /finish_weight_update: weight_version (string or null), baseline (an object of key ->
// checksum string, as /weight_checker's checksum answers).
FinishWeightUpdateRequest parse_finish_weight_update(const nlohmann::json& body);

struct VllmPauseRequest {
  std::string mode;         // "abort", "wait" or "keep"
  bool clear_cache = true;  // flush the engine's caches after pausing (ignored for "keep")
};
// POST /pause query: mode (abort, the default, wait, keep), clear_cache (boolean, default true),
// wait_for_inflight_requests (boolean, default false; true means mode "wait"). `route` names the
// route in errors (/sleep reads its mode with the same rules).
VllmPauseRequest parse_vllm_pause(const QueryParams& query, const char* route = "pause");

struct SleepRequest {
  int level = 1;           // 1: weights kept in host memory; 2: weights may be dropped
  VllmPauseRequest pause;  // how generation stops first
};
// POST /sleep query: level (1, the default, or 2), mode (as /pause).
SleepRequest parse_sleep(const QueryParams& query);
// POST /wake_up query: tags (repeated; none: every tag asleep).
std::vector<std::string> parse_wake_up_tags(const QueryParams& query);

struct WeightCheckerRequest {
  std::string action;              // checksum, reset, compare
  Checksums baseline;              // compare
  std::vector<Checksums> reports;  // compare: the caller's other checksum answers (optional)
};
// POST /weight_checker: action (required: checksum, reset or compare), baseline (compare: an
// object of key -> checksum), checksums (compare, optional: a list of such objects).
WeightCheckerRequest parse_weight_checker(const nlohmann::json& body);

}  // namespace ferry::control
