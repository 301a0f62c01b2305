// tests/disk/fuzz_safetensors.cpp: libFuzzer target over the safetensors header validator. Input:
// 8 bytes (little-endian) giving the data section's length, then the JSON header. Any input must
// yield a File whose tensors fit the data section exactly, in order, without overlap and with
// sizes matching dtype and shape, or raise ferry::Error(CORRUPT_DATA); never crash, hang or throw
// anything else.
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <ferry/formats/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 8);
  const std::string_view header(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    const ferry::safetensors::File file = ferry::safetensors::parse_header("fuzz", header, data_bytes);
    std::uint64_t next = 0;
    for (const auto& t : file.tensors) {
      const auto bytes = ferry::byte_size(t.dtype, t.shape);
      if (!bytes || *bytes != t.size() || t.begin != next || t.end > data_bytes) std::abort();
      next = t.end;
    }
    if (next != data_bytes) std::abort();
  } catch (const ferry::Error& e) {
    if (e.code() != FERRY_STATUS_CORRUPT_DATA) std::abort();
  }
  return 0;
}
