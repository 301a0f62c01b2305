// capi/nccl.cpp: the C API of NCCL weight-update groups: rank 0 (ferry_nccl_group_*, over
// session::NcclTrainerGroup) and the embedded receiver's side
// (ferry_receiver_*_weights_update_group / _update_weights_from_distributed, over
// receiver::WeightUpdateGroups, one per receiver handle). Without the trainer library in the
// build (no session library) the trainer functions return UNIMPLEMENTED; without NCCL the
// classes themselves answer UNIMPLEMENTED.
#include <ferry/ferry.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "capi/capi_boundary.hpp"
#include "capi/config_source.hpp"
#include "capi/receiver_extension.hpp"
#include "capi/tensor_input.hpp"
#include "control/requests.hpp"
#include "group/receiver_groups.hpp"
#include "group/trainer_group.hpp"

struct ferry_nccl_group {
  std::unique_ptr<ferry::registry::Registry> registry;  // outlives the group
  std::unique_ptr<ferry::session::NcclTrainerGroup> group;
};

namespace {

using Millis = std::chrono::milliseconds;

Millis or_default(std::int64_t ms, std::int64_t fallback, const char* function, const char* what) {
  if (ms < 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} is {} ms, must be >= 0 (0: {} ms)",
                function, what, ms, fallback);
  }
  return Millis(ms == 0 ? fallback : ms);
}

std::vector<ferry::session::TensorView> views_of(const ferry_tensor_t* const* tensors,
                                                 std::size_t count, const char* function) {
  if (count > 0 && tensors == nullptr) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tensors is NULL with {} tensors", function,
                count);
  }
  if (count == 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: an update needs at least one tensor",
                function);
  }
  const auto inputs = ferry::capi::read_tensors(tensors, count, function);
  std::vector<ferry::session::TensorView> views;
  views.reserve(inputs.size());
  for (const auto& in : inputs) {
    views.push_back({in.name, in.dtype, in.shape, in.data, in.memory_kind, in.device});
  }
  return views;
}

ferry::session::NcclTrainerGroup& open_group(ferry_nccl_group_t* group, const char* function) {
  ferry::capi::require(group, function, "group");
  if (!group->group) {
    ferry::fail(FERRY_STATUS_FAILED_PRECONDITION, "{}: the group was not created", function);
  }
  return *group->group;
}

// The embedded receiver's groups (one WeightUpdateGroups per receiver handle).
std::shared_ptr<ferry::receiver::WeightUpdateGroups> groups_of(ferry_receiver_t* receiver,
                                                               const char* function) {
  ferry::capi::require(receiver, function, "receiver");
  auto any = ferry::capi::receiver_nccl_groups(receiver, [](ferry::receiver::Receiver& r) {
    return std::static_pointer_cast<void>(
        std::make_shared<ferry::receiver::WeightUpdateGroups>(r));
  });
  return std::static_pointer_cast<ferry::receiver::WeightUpdateGroups>(any);
}

}  // namespace

extern "C" {

FERRY_API ferry_error_t* ferry_nccl_group_create(const ferry_nccl_group_create_args_t* args,
                                                 ferry_nccl_group_t** out) {
  static constexpr const char* kFn = "ferry_nccl_group_create";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(out, kFn, "out");
    *out = nullptr;
    const auto a = ferry::capi::read_struct(
        args, FERRY_STRUCT_SIZE(ferry_nccl_group_create_args_t, world_size), kFn, "args");
    if (a.master_port == 0) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: master_port must be from 1 to 65535", kFn);
    }
    if (a.world_size < 1) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "{}: world_size must be >= 1 (the trainer plus every receiver rank)", kFn);
    }
    if (a.group_name != nullptr && a.group_name[0] == '\0') {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: group_name is empty (NULL: the default)",
                  kFn);
    }
    if (a.device < 0) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: device {} is not a CUDA device ordinal",
                  kFn, a.device);
    }
    const Millis init_timeout = or_default(a.init_timeout_ms, 120000, kFn, "init_timeout_ms");
    const Millis bucket_timeout = or_default(a.bucket_timeout_ms, 120000, kFn, "bucket_timeout_ms");
    auto handle = std::make_unique<ferry_nccl_group_t>();
    const ferry::config::Config config = ferry::capi::load_config(a.config, kFn);
    handle->registry = ferry::capi::make_registry(config);
    ferry::session::NcclTrainerOptions o;
    o.transport = config.update.group_transport;
    o.master_address = a.master_address != nullptr ? a.master_address : "127.0.0.1";
    o.master_port = a.master_port;
    o.world_size = a.world_size;
    if (a.group_name != nullptr) o.group_name = a.group_name;
    o.device = a.device;
    if (a.bucket_bytes != 0) o.bucket_bytes = a.bucket_bytes;
    o.init_timeout = init_timeout;
    o.bucket_timeout = bucket_timeout;
    handle->group = std::make_unique<ferry::session::NcclTrainerGroup>(*handle->registry, o);
    *out = handle.release();
  });
}

FERRY_API ferry_error_t* ferry_nccl_group_update_request(ferry_nccl_group_t* group,
                                                         const ferry_tensor_t* const* tensors,
                                                         size_t num_tensors,
                                                         const char* weight_version,
                                                         char** json) {
  static constexpr const char* kFn = "ferry_nccl_group_update_request";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(json, kFn, "json");
    *json = nullptr;
    auto& g = open_group(group, kFn);
    const auto views = views_of(tensors, num_tensors, kFn);
    std::optional<std::string> label;
    if (weight_version != nullptr) label = weight_version;
    *json = ferry::capi::owned_string(g.update_request(views, label));
  });
}

FERRY_API ferry_error_t* ferry_nccl_group_broadcast(ferry_nccl_group_t* group,
                                                    const ferry_tensor_t* const* tensors,
                                                    size_t num_tensors, uint64_t* bytes,
                                                    double* seconds) {
  static constexpr const char* kFn = "ferry_nccl_group_broadcast";
  return ferry::capi::guard(kFn, [&] {
    if (bytes != nullptr) *bytes = 0;
    if (seconds != nullptr) *seconds = 0;
    auto& g = open_group(group, kFn);
    const auto report = g.broadcast(views_of(tensors, num_tensors, kFn));
    if (bytes != nullptr) *bytes = report.bytes;
    if (seconds != nullptr) *seconds = report.seconds;
  });
}

FERRY_API ferry_error_t* ferry_nccl_group_reinit(ferry_nccl_group_t* group) {
  static constexpr const char* kFn = "ferry_nccl_group_reinit";
  return ferry::capi::guard(kFn, [&] {
    open_group(group, kFn).reinit();
  });
}

FERRY_API ferry_error_t* ferry_nccl_group_abort(ferry_nccl_group_t* group, const char* reason) {
  static constexpr const char* kFn = "ferry_nccl_group_abort";
  return ferry::capi::guard(kFn, [&] {
    open_group(group, kFn).abort(reason != nullptr ? reason : "aborted through the C API");
  });
}

FERRY_API ferry_error_t* ferry_nccl_group_close(ferry_nccl_group_t* group, int64_t timeout_ms,
                                                char** how) {
  static constexpr const char* kFn = "ferry_nccl_group_close";
  return ferry::capi::guard(kFn, [&] {
    if (how != nullptr) *how = nullptr;
    const Millis timeout = or_default(timeout_ms, 15000, kFn, "timeout_ms");
    const std::string outcome = open_group(group, kFn).close(timeout);
    if (how != nullptr) *how = ferry::capi::owned_string(outcome);
  });
}

FERRY_API void ferry_nccl_group_destroy(ferry_nccl_group_t* group) {
  if (group == nullptr) return;
  try {
    group->group.reset();  // closes (bounded) when not closed
  } catch (...) {
    // Destruction cannot report.
  }
  delete group;
}

FERRY_API ferry_error_t* ferry_receiver_init_weights_update_group(
    ferry_receiver_t* receiver, const ferry_weights_update_group_args_t* args) {
  static constexpr const char* kFn = "ferry_receiver_init_weights_update_group";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    const auto a = ferry::capi::read_struct(
        args, FERRY_STRUCT_SIZE(ferry_weights_update_group_args_t, world_size), kFn, "args");
    // The HTTP route's parser states every rule once; the fields are the same.
    nlohmann::json body{{"master_address", a.master_address != nullptr ? a.master_address : ""},
                        {"master_port", a.master_port},
                        {"rank_offset", a.rank_offset},
                        {"world_size", a.world_size}};
    if (a.group_name != nullptr) body["group_name"] = a.group_name;
    if (a.backend != nullptr) body["backend"] = a.backend;
    const Millis timeout = or_default(a.timeout_ms, 120000, kFn, "timeout_ms");
    body["timeout_s"] = static_cast<double>(timeout.count()) / 1000.0;
    ferry::nccl::GroupInit init;
    try {
      init = ferry::control::parse_group_init(body);
    } catch (const ferry::Error& e) {
      ferry::fail(e.code(), "{}: {}", kFn, e.what());
    }
    groups_of(receiver, kFn)->init(std::move(init));
  });
}

FERRY_API ferry_error_t* ferry_receiver_update_weights_from_distributed(ferry_receiver_t* receiver,
                                                                        const char* request_json,
                                                                        uint64_t* version) {
  static constexpr const char* kFn = "ferry_receiver_update_weights_from_distributed";
  return ferry::capi::guard(kFn, [&] {
    if (version != nullptr) *version = 0;
    ferry::capi::require(receiver, kFn, "receiver");
    ferry::capi::require(request_json, kFn, "request_json");
    ferry::receiver::DistributedUpdate request;
    try {
      request = ferry::control::parse_distributed_update(nlohmann::json::parse(request_json));
    } catch (const nlohmann::json::exception& e) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: request_json is not JSON: {}", kFn,
                  e.what());
    } catch (const ferry::Error& e) {
      ferry::fail(e.code(), "{}: {}", kFn, e.what());
    }
    const auto report = groups_of(receiver, kFn)->update(request);
    if (version != nullptr) *version = report.version.number;
  });
}

FERRY_API ferry_error_t* ferry_receiver_destroy_weights_update_group(ferry_receiver_t* receiver,
                                                                    const char* group_name,
                                                                    int64_t timeout_ms,
                                                                    char** how) {
  static constexpr const char* kFn = "ferry_receiver_destroy_weights_update_group";
  return ferry::capi::guard(kFn, [&] {
    if (how != nullptr) *how = nullptr;
    ferry::capi::require(receiver, kFn, "receiver");
    nlohmann::json body = nlohmann::json::object();
    if (group_name != nullptr) body["group_name"] = group_name;
    const std::string name = ferry::control::parse_group_name(body);
    const Millis timeout = or_default(timeout_ms, 15000, kFn, "timeout_ms");
    const std::string outcome = groups_of(receiver, kFn)->destroy(name, timeout);
    if (how != nullptr) *how = ferry::capi::owned_string(outcome);
  });
}

}  // extern "C"
