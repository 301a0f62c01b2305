// Plugin-side error and negotiation helpers (see ferry/sdk/error.hpp).
#include "ferry/sdk/error.hpp"

#include <atomic>

namespace ferry {

const char* status_name(ferry_status_code_t code) noexcept {
  switch (code) {
    case FERRY_STATUS_OK: return "OK";
    case FERRY_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case FERRY_STATUS_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case FERRY_STATUS_INCOMPATIBLE: return "INCOMPATIBLE";
    case FERRY_STATUS_NOT_FOUND: return "NOT_FOUND";
    case FERRY_STATUS_IO: return "IO";
    case FERRY_STATUS_CORRUPT_DATA: return "CORRUPT_DATA";
    case FERRY_STATUS_TIMEOUT: return "TIMEOUT";
    case FERRY_STATUS_PEER_FAILED: return "PEER_FAILED";
    case FERRY_STATUS_ABORTED: return "ABORTED";
    case FERRY_STATUS_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case FERRY_STATUS_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case FERRY_STATUS_INTERNAL: return "INTERNAL";
    case FERRY_STATUS_END_OF_STREAM: return "END_OF_STREAM";
  }
  return "UNKNOWN";
}

namespace sdk {
namespace {
std::atomic<const ferry_host_api_t*> g_host{nullptr};
}  // namespace

void set_host_api(const ferry_host_api_t* host) noexcept { g_host.store(host); }
const ferry_host_api_t* host_api() noexcept { return g_host.load(); }

ferry_error_t* make_error(ferry_status_code_t code, const std::string& message) noexcept {
  const ferry_host_api_t* host = host_api();
  // Without a host there is nobody to free the error; a plugin cannot get here before negotiate.
  if (host == nullptr || host->error_new == nullptr) return nullptr;
  return host->error_new(code, message.c_str());
}

void log(ferry_log_level_t level, const char* plugin_name, const std::string& message) noexcept {
  const ferry_host_api_t* host = host_api();
  if (host != nullptr && host->log != nullptr) host->log(level, plugin_name, message.c_str());
}

ferry_error_t* negotiate(ferry_plugin_negotiation_t* n, ferry_plugin_kind_t kind,
                         const char* name, const char* version, const void* api,
                         const char* const* option_keys) noexcept {
  if (n == nullptr) return nullptr;  // nobody to answer
  const size_t have = n->struct_size;
  if (have >= FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, host)) set_host_api(n->host);
  if (have < FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, api)) {
    return make_error(FERRY_STATUS_INCOMPATIBLE,
                      fmt::format("plugin '{}': negotiation struct is {} bytes, needs {}", name,
                                  have, FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, api)));
  }
  n->plugin_abi_major = FERRY_PLUGIN_ABI_MAJOR;
  n->plugin_abi_minor = FERRY_PLUGIN_ABI_MINOR;
  n->kind = kind;
  n->name = name;
  n->version = version;
  n->api = api;
  if (have >= FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, option_keys)) {
    n->option_keys = option_keys;
  }
  if (n->host_abi_major != FERRY_PLUGIN_ABI_MAJOR) {
    return make_error(FERRY_STATUS_INCOMPATIBLE,
                      fmt::format("plugin '{}' implements ABI {}.{}, host offers {}.{}", name,
                                  FERRY_PLUGIN_ABI_MAJOR, FERRY_PLUGIN_ABI_MINOR,
                                  n->host_abi_major, n->host_abi_minor));
  }
  return nullptr;
}

}  // namespace sdk
}  // namespace ferry
