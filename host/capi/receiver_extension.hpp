// capi/receiver_extension.hpp: what host/capi/nccl.cpp needs from an embedded-receiver handle
// (whose struct lives in receiver.cpp): its receiver with the parameter layout fixed, and a slot
// for the handle's NCCL weight-update groups that is destroyed with the handle, before the
// receiver they use.
#pragma once

#include <ferry/ferry.h>

#include <functional>
#include <memory>

#include "receiver/receiver.hpp"

namespace ferry::capi {

// Fixes the layout (registers the pending parameters, as the first ferry_receiver_serve does),
// then returns the handle's extension object, created by `make` on first use. Serialized with
// register / serve / stop on the handle. Defined in receiver.cpp.
std::shared_ptr<void> receiver_nccl_groups(
    ferry_receiver_t* handle, const std::function<std::shared_ptr<void>(receiver::Receiver&)>& make);

// Fixes the layout as receiver_nccl_groups does and returns the handle's receiver (valid until
// ferry_receiver_destroy), for operations beside the handle such as host/capi/ckpt_engine.cpp.
// Defined in receiver.cpp.
receiver::Receiver& receiver_with_layout(ferry_receiver_t* handle);

// The handle's receiver without fixing the layout (engine callbacks may be set before the
// parameters are all registered). Defined in receiver.cpp.
receiver::Receiver& receiver_of(ferry_receiver_t* handle);

}  // namespace ferry::capi
