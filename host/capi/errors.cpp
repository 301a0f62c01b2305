// capi/errors.cpp: the library-wide part of the C API: versions, error objects, status names and
// owned strings.
#include <ferry/ferry.h>

#include <cstdlib>
#include <cstring>

#include "capi/capi_boundary.hpp"
#include "ferry_build_config.h"

namespace ferry::capi {

char* owned_string(const std::string& text) {
  // malloc, so ferry_string_free is a plain free() whatever allocator the caller's runtime uses.
  auto* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) throw std::bad_alloc();
  std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

}  // namespace ferry::capi

extern "C" {

FERRY_API void ferry_api_version(uint32_t* major, uint32_t* minor) {
  if (major != nullptr) *major = FERRY_API_MAJOR;
  if (minor != nullptr) *minor = FERRY_API_MINOR;
}

FERRY_API const char* ferry_version_string(void) { return FERRY_VERSION; }

FERRY_API ferry_status_code_t ferry_error_code(const ferry_error_t* error) {
  return ferry::host_api_table()->error_code(error);
}

FERRY_API const char* ferry_error_message(const ferry_error_t* error) {
  return ferry::host_api_table()->error_message(error);
}

FERRY_API void ferry_error_free(ferry_error_t* error) {
  ferry::host_api_table()->error_free(error);
}

FERRY_API const char* ferry_status_name(ferry_status_code_t code) {
  return ferry::status_name(code);
}

FERRY_API void ferry_string_free(char* string) { std::free(string); }

}  // extern "C"
