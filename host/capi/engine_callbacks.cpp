// capi/engine_callbacks.cpp: ferry_receiver_set_engine_callbacks and ferry_error_create: the C
// callbacks of an engine around an embedded receiver, turned into the receiver's EngineControl
// callbacks (receiver/engine_control.hpp); a callback's error becomes a ferry::Error with its
// code and message, so the request that ran it fails with them.
#include <ferry/ferry.h>

#include <memory>
#include <string>
#include <vector>

#include "capi/capi_boundary.hpp"
#include "capi/receiver_extension.hpp"
#include "common/host_api.hpp"
#include "receiver/engine_control.hpp"

namespace {

// Takes ownership of a callback's result: throws its code and message, frees it.
void rethrow(ferry_error_t* error) {
  if (error == nullptr) return;
  const ferry_status_code_t code = ferry_error_code(error);
  std::string message = ferry_error_message(error);
  ferry_error_free(error);
  throw ferry::Error(code == FERRY_STATUS_OK ? FERRY_STATUS_INTERNAL : code, std::move(message));
}

ferry_pause_mode_t c_mode(ferry::receiver::PauseMode mode) {
  switch (mode) {
    case ferry::receiver::PauseMode::abort:
      return FERRY_PAUSE_ABORT;
    case ferry::receiver::PauseMode::retract:
      return FERRY_PAUSE_RETRACT;
    case ferry::receiver::PauseMode::in_place:
      return FERRY_PAUSE_IN_PLACE;
  }
  return FERRY_PAUSE_ABORT;
}

}  // namespace

extern "C" {

FERRY_API ferry_error_t* ferry_error_create(ferry_status_code_t code, const char* message) {
  return ferry::host_api_table()->error_new(code, message != nullptr ? message : "");
}

FERRY_API ferry_error_t* ferry_receiver_set_engine_callbacks(
    ferry_receiver_t* receiver, const ferry_engine_callbacks_t* callbacks) {
  static constexpr const char* kFn = "ferry_receiver_set_engine_callbacks";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(receiver, kFn, "receiver");
    ferry::receiver::EngineCallbacks out;
    if (callbacks != nullptr) {
      if (callbacks->struct_size < FERRY_STRUCT_SIZE(ferry_engine_callbacks_t, num_memory_tags)) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "{}: callbacks->struct_size {} is smaller than this API's ({})", kFn,
                    callbacks->struct_size,
                    FERRY_STRUCT_SIZE(ferry_engine_callbacks_t, num_memory_tags));
      }
      const ferry_engine_callbacks_t c = *callbacks;
      void* user = c.user_data;
      if (c.pause != nullptr) {
        out.pause = [f = c.pause, user](ferry::receiver::PauseMode mode) {
          std::uint64_t paused = 0;
          rethrow(f(user, c_mode(mode), &paused));
          return paused;
        };
      }
      if (c.resume != nullptr) {
        out.resume = [f = c.resume, user](bool empty) { rethrow(f(user, empty ? 1 : 0)); };
      }
      if (c.flush_cache != nullptr) {
        out.flush_cache = [f = c.flush_cache, user](bool empty) {
          rethrow(f(user, empty ? 1 : 0));
        };
      }
      if (c.post_load != nullptr) {
        out.post_load = [f = c.post_load, user] { rethrow(f(user)); };
      }
      if (c.memory != nullptr) {
        out.memory = [f = c.memory, user](const std::vector<std::string>& tags, bool release) {
          std::vector<const char*> names;
          for (const auto& t : tags) names.push_back(t.c_str());
          rethrow(f(user, names.data(), names.size(), release ? 1 : 0));
        };
      }
      if (c.num_memory_tags > 0 && c.memory_tags == nullptr) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: memory_tags is NULL with {} tags", kFn,
                    c.num_memory_tags);
      }
      for (std::size_t i = 0; i < c.num_memory_tags; ++i) {
        if (c.memory_tags[i] == nullptr) {
          ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: memory_tags[{}] is NULL", kFn, i);
        }
        out.memory_tags.emplace_back(c.memory_tags[i]);
      }
    }
    ferry::capi::receiver_of(receiver).engine_control().set_callbacks(std::move(out));
  });
}

}  // extern "C"
