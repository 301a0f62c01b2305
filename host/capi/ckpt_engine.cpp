// capi/ckpt_engine.cpp: ferry_receiver_update_weights_from_ipc: one update from a
// checkpoint-engine ParameterServer into an embedded receiver, over
// receiver::update_weights_from_ipc (the same code as POST /update_weights_from_ipc).
#include <ferry/ferry.h>

#include <nlohmann/json.hpp>

#include "capi/capi_boundary.hpp"
#include "capi/receiver_extension.hpp"
#include "control/requests.hpp"
#include "receiver/receiver_ckpt.hpp"

extern "C" {

FERRY_API ferry_error_t* ferry_receiver_update_weights_from_ipc(ferry_receiver_t* receiver,
                                                               const char* request_json,
                                                               uint64_t* version) {
  static constexpr const char* kFn = "ferry_receiver_update_weights_from_ipc";
  return ferry::capi::guard(kFn, [&] {
    if (version != nullptr) *version = 0;
    ferry::capi::require(receiver, kFn, "receiver");
    ferry::capi::require(request_json, kFn, "request_json");
    ferry::receiver::IpcUpdateRequest request;
    try {
      request = ferry::control::parse_ipc_update(nlohmann::json::parse(request_json));
    } catch (const nlohmann::json::exception& e) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: request_json is not JSON: {}", kFn,
                  e.what());
    } catch (const ferry::Error& e) {
      ferry::fail(e.code(), "{}: {}", kFn, e.what());
    }
    const auto report = ferry::receiver::update_weights_from_ipc(
        ferry::capi::receiver_with_layout(receiver), request);
    if (version != nullptr) *version = report.version.number;
  });
}

}  // extern "C"
