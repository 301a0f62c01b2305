// capi/capi_boundary.hpp: what every ferry_* function of libferry.so does at the C boundary:
// turn exceptions into ferry_error_t objects, read caller structs by struct_size, and fill
// `// out` structs no further than the caller's struct_size.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "common/host_api.hpp"

namespace ferry::capi {

// Creates an error object the C caller frees with ferry_error_free.
inline ferry_error_t* new_error(ferry_status_code_t code, const std::string& message) noexcept {
  return host_api_table()->error_new(code, message.c_str());
}

// Runs `body`; any exception becomes the returned error (ferry::Error keeps its code,
// std::bad_alloc is OUT_OF_MEMORY, anything else INTERNAL). NULL when the body returned.
template <typename Body>
ferry_error_t* guard(const char* function, Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Error& e) {
    return new_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return new_error(FERRY_STATUS_OUT_OF_MEMORY, std::string(function) + ": out of host memory");
  } catch (const std::exception& e) {
    return new_error(FERRY_STATUS_INTERNAL, std::string(function) + ": " + e.what());
  } catch (...) {
    return new_error(FERRY_STATUS_INTERNAL, std::string(function) + ": unknown exception");
  }
}

// Throws INVALID_ARGUMENT "<function>: <what> is NULL" when `pointer` is NULL.
inline void require(const void* pointer, const char* function, const char* what) {
  if (pointer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} is NULL", function, what);
}

// A copy of the caller's struct in this library's layout: the bytes the caller declared
// (struct_size) and zeros past them, so fields the caller's header lacks read as absent.
// `min_size` is the smallest struct_size accepted (the fields every version has).
template <typename T>
T read_struct(const T* in, std::size_t min_size, const char* function, const char* what) {
  require(in, function, what);
  if (in->struct_size < min_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: {}->struct_size is {}, needs at least {} (set it with FERRY_STRUCT_SIZE)", function,
         what, in->struct_size, min_size);
  }
  T copy;
  std::memset(&copy, 0, sizeof(T));
  std::memcpy(&copy, in, std::min(in->struct_size, sizeof(T)));
  copy.struct_size = sizeof(T);
  return copy;
}

// Writes `value` into the caller's `out` up to out->struct_size, keeping the caller's size.
template <typename T>
void write_struct(T* out, const T& value, const char* function, const char* what) {
  require(out, function, what);
  const std::size_t caller_size = out->struct_size;
  if (caller_size < sizeof(std::size_t)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: {}->struct_size is {} (set it with FERRY_STRUCT_SIZE)", function, what, caller_size);
  }
  std::memcpy(out, &value, std::min(caller_size, sizeof(T)));
  out->struct_size = caller_size;
}

// A NUL-terminated copy the caller frees with ferry_string_free.
char* owned_string(const std::string& text);

}  // namespace ferry::capi
