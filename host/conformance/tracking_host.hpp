// conformance/tracking_host.hpp: the host table the conformance suite negotiates with. It forwards
// to the real host services and remembers every error object it made, so the suite can tell an
// error made through the host (required) from one the plugin invented.
#pragma once

#include <ferry/plugin.h>

#include <string>

namespace ferry::conformance {

// Static; valid for the life of the process (plugins may keep it).
const ferry_host_api_t* tracking_host_api() noexcept;

// What the suite learned about an error a plugin returned.
struct ErrorSeen {
  bool made_by_host = false;
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
};

// Inspects and frees `error` when this host made it; an error the host did not make is only
// reported (freeing or reading it could crash). NULL gives made_by_host = false, code OK.
ErrorSeen take_error(ferry_error_t* error);

}  // namespace ferry::conformance
