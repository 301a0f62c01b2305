// The host's error objects and the ferry_host_api_t table given to plugins.
#include "common/host_api.hpp"

#include "common/log.hpp"

#include <new>

struct ferry_error {
  ferry_status_code_t code;
  std::string message;
};

namespace ferry {
namespace {

// Returned when allocating an error fails; error_free recognizes and ignores it.
ferry_error g_out_of_memory{FERRY_STATUS_OUT_OF_MEMORY, "out of host memory creating an error"};

ferry_error_t* api_error_new(ferry_status_code_t code, const char* message) {
  try {
    return new ferry_error{code, message ? message : ""};
  } catch (...) {
    return &g_out_of_memory;
  }
}

void api_error_free(ferry_error_t* e) {
  if (e != &g_out_of_memory) delete e;
}

ferry_status_code_t api_error_code(const ferry_error_t* e) {
  return e ? e->code : FERRY_STATUS_OK;
}

const char* api_error_message(const ferry_error_t* e) { return e ? e->message.c_str() : ""; }

void api_log(ferry_log_level_t level, const char* plugin_name, const char* message) {
  try {
    auto log = logger(std::string("plugin.") + (plugin_name ? plugin_name : "?"));
    const char* text = message ? message : "";
    switch (level) {
      case FERRY_LOG_TRACE: log->trace("{}", text); break;
      case FERRY_LOG_DEBUG: log->debug("{}", text); break;
      case FERRY_LOG_INFO: log->info("{}", text); break;
      case FERRY_LOG_WARN: log->warn("{}", text); break;
      default: log->error("{}", text); break;
    }
  } catch (...) {
    // Logging must never fail a plugin call.
  }
}

const ferry_host_api_t kHostApi = {
    FERRY_STRUCT_SIZE(ferry_host_api_t, log),
    FERRY_PLUGIN_ABI_MAJOR,
    FERRY_PLUGIN_ABI_MINOR,
    api_error_new,
    api_error_free,
    api_error_code,
    api_error_message,
    api_log,
};

}  // namespace

const ferry_host_api_t* host_api_table() noexcept { return &kHostApi; }

void ErrorDeleter::operator()(ferry_error_t* e) const noexcept { api_error_free(e); }

ferry_status_code_t error_code(const ferry_error_t* e) noexcept { return api_error_code(e); }

std::string error_message(const ferry_error_t* e) { return api_error_message(e); }

void throw_if_error(ferry_error_t* e, const std::string& context) {
  if (e == nullptr) return;
  ErrorPtr owned(e);
  throw Error(owned->code, context.empty() ? owned->message : context + ": " + owned->message);
}

}  // namespace ferry
