// receiver/gpu_uuid.hpp: which of the ParameterServer's ZMQ addresses belongs to this
// worker: checkpoint-engine keys them by the physical GPU's UUID string.
#pragma once

#include <map>
#include <string>

namespace ferry::ckpt_engine {

// "GPU-" followed by the 16 UUID bytes as lower-case hex in 8-4-4-4-12 groups: the string
// checkpoint-engine builds from torch's device properties, and nvidia-smi -L prints.
std::string format_gpu_uuid(const unsigned char (&bytes)[16]);

// The address for `device_uuid` in `zmq_handles` (GPU UUID -> address). Throws
// ferry::Error(NOT_FOUND) naming this GPU and the UUIDs that were offered.
const std::string& pick_address(const std::map<std::string, std::string>& zmq_handles,
                                const std::string& device_uuid);

}  // namespace ferry::ckpt_engine
