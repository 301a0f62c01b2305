// demo/transport.hpp: which transport `ferry demo` drives, from demo.transport ("auto" included)
// and what this build and machine can load.
#pragma once

#include <string>

#include "registry/registry.hpp"

namespace ferry::demo {

// "auto" picks the best transport this build can drive from the demo: with the receiver on a GPU,
// CUDA IPC (the trainer's weights on the same GPU, a colocated push) when its plugin loads; else
// UCX (a push through the session protocol) when its plugin loads; else disk (checkpoints the
// receiver reads). "inline" pushes with the bytes on the session socket itself.
// Throws ferry::Error (INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED) naming the transport and why.
std::string choose_transport(const std::string& requested, const std::string& device,
                             const registry::Registry& registry);

}  // namespace ferry::demo
