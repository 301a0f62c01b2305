// control/requests.hpp: the JSON bodies of the control routes, checked and turned into the
// requests the receiver and its groups act on (receiver/, group/ parse no JSON). One parser per
// body, shared by the HTTP server (control/http_server.cpp) and the C API (host/capi), so each
// rule is stated once. Every refusal is INVALID_ARGUMENT naming the field (or tensor).
//
// Threading: pure functions, any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <string>
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

}  // namespace ferry::control
