// capi/receiver.cpp: ferry_receiver_*: the embedded receiver of the C API: a receiver::Receiver
// over engine-owned parameters, served in the background by a session::ReceiverEndpoint.
#include <ferry/ferry.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_boundary.hpp"
#include "capi/config_source.hpp"
#include "capi/receiver_extension.hpp"
#include "capi/tensor_input.hpp"
#include "order/stream_order.hpp"
#include "receiver/receiver.hpp"
#include "session/receiver_endpoint.hpp"

// Members in dependency order: the endpoint borrows the receiver, config and registry, the
// receiver borrows the config and registry; destruction runs bottom-up.
struct ferry_receiver {
  ferry::config::Config config;
  std::unique_ptr<ferry::registry::Registry> registry;
  std::unique_ptr<ferry::receiver::Receiver> receiver;
  std::mutex mutex;  // serializes register/serve/stop
  std::vector<ferry::receiver::Receiver::EngineParam> pending;  // until the first serve
  std::set<std::string> names;
  bool layout_fixed = false;
  std::unique_ptr<ferry::session::ReceiverEndpoint> endpoint;
  std::shared_ptr<void> nccl_groups;  // capi/nccl.cpp; last: destroyed before the receiver
};

struct ferry_fingerprints {
  std::vector<std::pair<std::string, std::uint64_t>> entries;
};

namespace {

std::vector<std::string> read_tags(const char* const* tags, std::size_t count,
                                   const char* function) {
  if (count > 0 && tags == nullptr) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tags is NULL with {} tags", function, count);
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < count; ++i) {
    if (tags[i] == nullptr || tags[i][0] == '\0') {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: tag {} is NULL or empty", function, i);
    }
    out.emplace_back(tags[i]);
  }
  return out;
}

// Registers the parameters registered so far (the first serve, NCCL group or checkpoint-engine
// update fixes the layout; later registrations are refused). Caller holds handle.mutex.
void fix_layout(ferry_receiver& handle) {
  if (!handle.layout_fixed && !handle.pending.empty()) {
    handle.receiver->register_params(handle.pending);
    handle.pending.clear();
  }
  handle.layout_fixed = true;
}

}  // namespace

std::shared_ptr<void> ferry::capi::receiver_nccl_groups(
    ferry_receiver_t* handle,
    const std::function<std::shared_ptr<void>(ferry::receiver::Receiver&)>& make) {
  const std::lock_guard lock(handle->mutex);
  fix_layout(*handle);
  if (!handle->nccl_groups) handle->nccl_groups = make(*handle->receiver);
  return handle->nccl_groups;
}

ferry::receiver::Receiver& ferry::capi::receiver_with_layout(ferry_receiver_t* handle) {
  const std::lock_guard lock(handle->mutex);
  fix_layout(*handle);
  return *handle->receiver;
}

ferry::receiver::Receiver& ferry::capi::receiver_of(ferry_receiver_t* handle) {
  return *handle->receiver;
}

extern "C" {

FERRY_API ferry_error_t* ferry_receiver_create(const ferry_config_source_t* config,
                                               ferry_receiver_t** out) {
  static constexpr const char* kFn = "ferry_receiver_create";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(out, kFn, "out");
    *out = nullptr;
    auto handle = std::make_unique<ferry_receiver_t>();
    handle->config = ferry::capi::load_config(config, kFn);
    // Embedded parameters carry the sender's names unless the config says otherwise.
    if (handle->config.receiver.model_family.empty()) {
      handle->config.receiver.model_family = handle->config.receiver.embedded_model_family;
    }
    handle->registry = ferry::capi::make_registry(handle->config);
    handle->receiver =
        std::make_unique<ferry::receiver::Receiver>(handle->config, *handle->registry);
    *out = handle.release();
  });
}

FERRY_API ferry_error_t* ferry_receiver_register_param(ferry_receiver_t* receiver,
                                                       const ferry_tensor_t* param) {
  static constexpr const char* kFn = "ferry_receiver_register_param";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    ferry::capi::require(param, kFn, "param");
    const std::lock_guard lock(receiver->mutex);
    const std::size_t index = receiver->pending.size();
    ferry::capi::TensorInput in = ferry::capi::read_tensor(param, index, kFn);
    if (receiver->layout_fixed) {
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION,
                  "{}: parameter '{}': the layout was fixed by the first ferry_receiver_serve; "
                  "register every parameter before serving",
                  kFn, in.name);
    }
    if (!receiver->names.insert(in.name).second) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: parameter '{}' is already registered", kFn,
                  in.name);
    }
    receiver->pending.push_back({std::move(in.name), in.dtype, std::move(in.shape), in.data,
                                 in.memory_kind, in.device});
  });
}

FERRY_API ferry_error_t* ferry_receiver_set_engine_order(ferry_receiver_t* receiver,
                                                        uint32_t order,
                                                        const void* const* handles,
                                                        size_t num_handles) {
  static constexpr const char* kFn = "ferry_receiver_set_engine_order";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    receiver->receiver->set_engine_order(
        ferry::order::checked_order(order, handles, num_handles, kFn));
  });
}

FERRY_API ferry_error_t* ferry_receiver_serve(ferry_receiver_t* receiver, const char* host,
                                              int32_t port, int32_t* bound_port) {
  static constexpr const char* kFn = "ferry_receiver_serve";
  return ferry::capi::guard(kFn, [&] {
    if (bound_port != nullptr) *bound_port = 0;
    ferry::capi::require(receiver, kFn, "receiver");
    if (port > 65535) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: port {} is out of range (0..65535)", kFn,
                  port);
    }
    const std::lock_guard lock(receiver->mutex);
    if (receiver->endpoint) {
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION, "{}: the receiver is already serving on {}",
                  kFn, receiver->endpoint->port());
    }
    fix_layout(*receiver);
    if (host != nullptr) receiver->config.receiver.host = host;
    if (port >= 0) receiver->config.receiver.port = static_cast<std::uint16_t>(port);
    auto endpoint = std::make_unique<ferry::session::ReceiverEndpoint>(
        *receiver->receiver, receiver->config, *receiver->registry);
    endpoint->start();
    if (bound_port != nullptr) *bound_port = endpoint->port();
    receiver->endpoint = std::move(endpoint);
  });
}

FERRY_API ferry_error_t* ferry_receiver_stop(ferry_receiver_t* receiver) {
  static constexpr const char* kFn = "ferry_receiver_stop";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    const std::lock_guard lock(receiver->mutex);
    if (receiver->endpoint) {
      receiver->endpoint->stop();
      receiver->endpoint.reset();
    }
  });
}

FERRY_API ferry_error_t* ferry_receiver_release(ferry_receiver_t* receiver,
                                                const char* const* tags, size_t num_tags) {
  static constexpr const char* kFn = "ferry_receiver_release";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    receiver->receiver->release(read_tags(tags, num_tags, kFn));
  });
}

FERRY_API ferry_error_t* ferry_receiver_resume(ferry_receiver_t* receiver,
                                               const char* const* tags, size_t num_tags) {
  static constexpr const char* kFn = "ferry_receiver_resume";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    receiver->receiver->resume(read_tags(tags, num_tags, kFn));
  });
}

FERRY_API ferry_error_t* ferry_receiver_version(ferry_receiver_t* receiver, uint64_t* number,
                                                char** label) {
  static constexpr const char* kFn = "ferry_receiver_version";
  return ferry::capi::guard(kFn, [&] {
    if (label != nullptr) *label = nullptr;
    ferry::capi::require(receiver, kFn, "receiver");
    const ferry::receiver::VersionInfo v = receiver->receiver->version();
    if (number != nullptr) *number = v.number;
    if (label != nullptr) *label = ferry::capi::owned_string(v.label);
  });
}

FERRY_API ferry_error_t* ferry_receiver_health(ferry_receiver_t* receiver, int* ready,
                                               char** state) {
  static constexpr const char* kFn = "ferry_receiver_health";
  return ferry::capi::guard(kFn, [&] {
    if (state != nullptr) *state = nullptr;
    ferry::capi::require(receiver, kFn, "receiver");
    const ferry::receiver::Health h = receiver->receiver->health();
    if (ready != nullptr) *ready = h.ready ? 1 : 0;
    if (state != nullptr) *state = ferry::capi::owned_string(h.state);
  });
}

FERRY_API ferry_error_t* ferry_receiver_fingerprints(ferry_receiver_t* receiver,
                                                     ferry_fingerprints_t** out) {
  static constexpr const char* kFn = "ferry_receiver_fingerprints";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(out, kFn, "out");
    *out = nullptr;
    ferry::capi::require(receiver, kFn, "receiver");
    auto fingerprints = std::make_unique<ferry_fingerprints_t>();
    for (const auto& [name, value] : receiver->receiver->fingerprints()) {
      fingerprints->entries.emplace_back(name, value);  // std::map: sorted by name
    }
    *out = fingerprints.release();
  });
}

FERRY_API size_t ferry_fingerprints_count(const ferry_fingerprints_t* fingerprints) {
  return fingerprints != nullptr ? fingerprints->entries.size() : 0;
}

FERRY_API ferry_error_t* ferry_fingerprints_entry(const ferry_fingerprints_t* fingerprints,
                                                  size_t index, const char** name,
                                                  uint64_t* value) {
  static constexpr const char* kFn = "ferry_fingerprints_entry";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(fingerprints, kFn, "fingerprints");
    if (index >= fingerprints->entries.size()) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: index {} is out of range ({} entries)", kFn,
                  index, fingerprints->entries.size());
    }
    if (name != nullptr) *name = fingerprints->entries[index].first.c_str();
    if (value != nullptr) *value = fingerprints->entries[index].second;
  });
}

FERRY_API void ferry_fingerprints_free(ferry_fingerprints_t* fingerprints) { delete fingerprints; }

FERRY_API void ferry_receiver_destroy(ferry_receiver_t* receiver) {
  if (receiver == nullptr) return;
  if (receiver->endpoint) {
    try {
      receiver->endpoint->stop();
    } catch (...) {
      // Destruction cannot report; the endpoint's destructor stops it again.
    }
  }
  delete receiver;
}

}  // extern "C"
