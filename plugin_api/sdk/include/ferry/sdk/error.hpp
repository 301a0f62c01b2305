// ferry/sdk/error.hpp: the C++ error type used inside the host and inside plugins, and the
// conversions to and from the C ABI's ferry_error_t objects at the plugin boundary.
//
// Inside C++ code an error is thrown as ferry::Error (a status code plus a message). At every
// C boundary (plugin entry points, the C API, HTTP handlers, the CLI) it is caught and turned
// into a ferry_error_t / an HTTP status / an exit code. Nothing throws across the C ABI.
#pragma once

#include <ferry/plugin.h>

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ferry {

class Error : public std::runtime_error {
 public:
  Error(ferry_status_code_t code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  ferry_status_code_t code() const noexcept { return code_; }

 private:
  ferry_status_code_t code_;
};

// Throws ferry::Error with a formatted message.
template <typename... Args>
[[noreturn]] void fail(ferry_status_code_t code, fmt::format_string<Args...> format,
                       Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// A short name for a status code ("INVALID_ARGUMENT").
const char* status_name(ferry_status_code_t code) noexcept;

namespace sdk {

// The host services a plugin received in ferry_plugin_negotiate. Set once by the plugin's entry
// (sdk::negotiate helpers do it); read from any thread afterwards.
void set_host_api(const ferry_host_api_t* host) noexcept;
const ferry_host_api_t* host_api() noexcept;

// Creates a ferry_error_t through the host (the caller of the plugin frees it).
ferry_error_t* make_error(ferry_status_code_t code, const std::string& message) noexcept;

// Runs `body` and converts any exception into a ferry_error_t: ferry::Error keeps its code,
// std::bad_alloc becomes OUT_OF_MEMORY, anything else INTERNAL. Use it as the whole body of
// every function a plugin exports through its table.
template <typename Body>
ferry_error_t* guard(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Error& e) {
    return make_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_error(FERRY_STATUS_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return make_error(FERRY_STATUS_INTERNAL, e.what());
  } catch (...) {
    return make_error(FERRY_STATUS_INTERNAL, "unknown exception");
  }
}

// Logs through the host's logger.
void log(ferry_log_level_t level, const char* plugin_name, const std::string& message) noexcept;

// Reads the negotiation struct safely and fills the plugin's answer. Returns NULL to accept, or
// an INCOMPATIBLE error when the host's major differs. Every in-tree plugin's entry is one call.
// `option_keys` (ABI 1.3): the static NULL-terminated list of the option keys create accepts
// (kNoOptions: none), answered to a host whose negotiation struct has the field; NULL: not
// declared.
ferry_error_t* negotiate(ferry_plugin_negotiation_t* negotiation, ferry_plugin_kind_t kind,
                         const char* name, const char* version, const void* api,
                         const char* const* option_keys = nullptr) noexcept;

// The option list of a plugin that takes no options.
inline constexpr const char* kNoOptions[] = {nullptr};

}  // namespace sdk
}  // namespace ferry
