// common/host_api.hpp: the host's side of the ABI's error objects and services: the
// ferry_host_api_t table handed to every plugin, and RAII/exception helpers the host uses around
// plugin calls.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <memory>
#include <string>

namespace ferry {

// The table given to plugins in ferry_plugin_negotiate. Static; valid for the process lifetime.
const ferry_host_api_t* host_api_table() noexcept;

struct ErrorDeleter {
  void operator()(ferry_error_t* e) const noexcept;
};
// Owns an error returned by a plugin.
using ErrorPtr = std::unique_ptr<ferry_error_t, ErrorDeleter>;

// Code and message of an error object ("" and OK for NULL).
ferry_status_code_t error_code(const ferry_error_t* e) noexcept;
std::string error_message(const ferry_error_t* e);

// Takes ownership of `e`; if non-NULL throws ferry::Error with `context` prefixed to the
// plugin's message ("plugin 'disk' source_read: <message>").
void throw_if_error(ferry_error_t* e, const std::string& context);

}  // namespace ferry
