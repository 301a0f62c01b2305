// capi/sender_unavailable.cpp: ferry_sender_* when libferry.so is built without the session
// library (host/session): every call fails with UNIMPLEMENTED saying so, keeping the exported
// symbol set the same in every build.
#include <ferry/ferry.h>

#include "capi/capi_boundary.hpp"

struct ferry_sender {};

namespace {

ferry_error_t* unavailable(const char* function) {
  return ferry::capi::new_error(
      FERRY_STATUS_UNIMPLEMENTED,
      std::string(function) + ": this libferry.so was built without the session library "
                              "(host/session), so it cannot send");
}

}  // namespace

extern "C" {

FERRY_API ferry_error_t* ferry_sender_create(const ferry_sender_create_args_t* /*args*/,
                                             ferry_sender_t** out) {
  if (out != nullptr) *out = nullptr;
  return unavailable("ferry_sender_create");
}

FERRY_API ferry_error_t* ferry_sender_push(ferry_sender_t* /*sender*/,
                                           const ferry_push_args_t* /*args*/,
                                           ferry_push_report_t** report) {
  if (report != nullptr) *report = nullptr;
  return unavailable("ferry_sender_push");
}

FERRY_API ferry_error_t* ferry_sender_status(ferry_sender_t* /*sender*/,
                                             ferry_push_report_t** report) {
  if (report != nullptr) *report = nullptr;
  return unavailable("ferry_sender_status");
}

FERRY_API ferry_error_t* ferry_sender_abort(ferry_sender_t* /*sender*/, const char* /*reason*/) {
  return unavailable("ferry_sender_abort");
}

FERRY_API void ferry_sender_destroy(ferry_sender_t* sender) { delete sender; }

}  // extern "C"
