// receiver/gpu_uuid.cpp: the GPU UUID string and the address chosen by it.
#include "receiver/gpu_uuid.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <vector>

namespace ferry::ckpt_engine {

std::string format_gpu_uuid(const unsigned char (&bytes)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

const std::string& pick_address(const std::map<std::string, std::string>& zmq_handles,
                                const std::string& device_uuid) {
  auto it = zmq_handles.find(device_uuid);
  if (it == zmq_handles.end()) {
    std::vector<std::string> offered;
    for (const auto& [uuid, address] : zmq_handles) offered.push_back(uuid);
    fail(FERRY_STATUS_NOT_FOUND,
         "zmq_handles has no address for this receiver's GPU {} (offered: {})", device_uuid,
         offered.empty() ? std::string("none") : fmt::format("{}", fmt::join(offered, ", ")));
  }
  return it->second;
}

}  // namespace ferry::ckpt_engine
