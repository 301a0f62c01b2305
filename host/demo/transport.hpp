// demo/transport.hpp: which transport `ferry demo` drives, from demo.transport ("auto" included)
// and what this build and machine can load, and whether its trainer keeps the weights on the GPU.
#pragma once

#include <string>

#include "config/config.hpp"
#include "registry/registry.hpp"

namespace ferry::demo {

struct DemoTransport {
  std::string name;             // "disk", "inline" or a transport plugin
  bool device_tensors = false;  // the trainer pushes from GPU memory (the receiver's device)
};

// "disk" (checkpoints the receiver reads) and "inline" (bytes on the session socket) are taken
// as given. Any other name, and "auto", go through the sender's own choice
// (session::choose_transport over update.transport_preference and the plugins' declared
// capabilities) for a receiver in another process on this host, with the trainer's weights on
// the receiver's GPU when there is one: "auto" takes the first plugin that fits, else inline.
// The trainer keeps its weights on that GPU when the chosen plugin moves CUDA memory.
// Throws ferry::Error naming the transport and why when a named one cannot serve the demo.
DemoTransport choose_transport(const config::Config& config, const registry::Registry& registry);

}  // namespace ferry::demo
