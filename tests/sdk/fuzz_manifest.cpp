// libFuzzer target: decode() must turn any byte string into a validated Manifest or a
// ferry::Error (CORRUPT_DATA), never crash, hang or throw anything else.
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ferry::manifest::Manifest m = ferry::manifest::decode(std::span(data, size));
    (void)ferry::manifest::signature(m);
    (void)ferry::manifest::tensor_descs(m);
  } catch (const ferry::Error& e) {
    if (e.code() != FERRY_STATUS_CORRUPT_DATA) std::abort();
  }
  return 0;
}
