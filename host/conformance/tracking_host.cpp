// conformance/tracking_host.cpp: a forwarding host table that records the error objects it makes.
#include "conformance/tracking_host.hpp"

#include <mutex>
#include <set>

#include "common/host_api.hpp"

namespace ferry::conformance {
namespace {

std::mutex g_mutex;
std::set<const ferry_error_t*>& live_errors() {
  static auto* errors = new std::set<const ferry_error_t*>();  // outlives late plugin calls
  return *errors;
}

ferry_error_t* tracked_error_new(ferry_status_code_t code, const char* message) {
  ferry_error_t* error = host_api_table()->error_new(code, message);
  std::lock_guard lock(g_mutex);
  live_errors().insert(error);
  return error;
}

void tracked_error_free(ferry_error_t* error) {
  {
    std::lock_guard lock(g_mutex);
    live_errors().erase(error);
  }
  host_api_table()->error_free(error);
}

ferry_status_code_t tracked_error_code(const ferry_error_t* error) {
  return host_api_table()->error_code(error);
}

const char* tracked_error_message(const ferry_error_t* error) {
  return host_api_table()->error_message(error);
}

void tracked_log(ferry_log_level_t level, const char* plugin_name, const char* message) {
  host_api_table()->log(level, plugin_name, message);
}

const ferry_host_api_t kTrackingHost = {
    FERRY_STRUCT_SIZE(ferry_host_api_t, log),
    FERRY_PLUGIN_ABI_MAJOR,
    FERRY_PLUGIN_ABI_MINOR,
    tracked_error_new,
    tracked_error_free,
    tracked_error_code,
    tracked_error_message,
    tracked_log,
};

}  // namespace

const ferry_host_api_t* tracking_host_api() noexcept {
  return &kTrackingHost;
}

ErrorSeen take_error(ferry_error_t* error) {
  ErrorSeen seen;
  if (error == nullptr) return seen;
  {
    std::lock_guard lock(g_mutex);
    seen.made_by_host = live_errors().count(error) != 0;
  }
  if (!seen.made_by_host) {
    seen.code = FERRY_STATUS_INTERNAL;
    return seen;
  }
  seen.code = tracked_error_code(error);
  seen.message = tracked_error_message(error);
  tracked_error_free(error);
  return seen;
}

}  // namespace ferry::conformance
