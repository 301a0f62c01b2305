// ckpt_engine/cuda_buffer.hpp: opens the ParameterServer's shared buffer with CUDA IPC on this
// worker's own device, copies buckets out of it, and gives torch's IPC reference back on close.
#pragma once

#include "ckpt_engine/zmq_worker.hpp"

#include <memory>

namespace ferry::ckpt_engine {

// The opener for device `device` (a CUDA ordinal of this process). Without CUDA in the build,
// open() refuses with UNIMPLEMENTED naming the missing feature.
std::unique_ptr<SharedBufferOpener> make_cuda_ipc_opener(int device);

}  // namespace ferry::ckpt_engine
