// demo/transport.cpp: the transport choice of `ferry demo` (see transport.hpp).
#include "demo/transport.hpp"

#include <ferry/sdk/error.hpp>

#include "common/log.hpp"
#include "store/store_device.hpp"

namespace ferry::demo {

std::string choose_transport(const std::string& requested, const std::string& device,
                             const registry::Registry& registry) {
  if (requested == "disk" || requested == "inline") return requested;
  const bool on_gpu = store::parse_store_device(device).cuda;
  auto loadable = [&](const char* name, std::string& why) {
    try {
      (void)registry.transport(name);
      return true;
    } catch (const Error& e) {
      why = e.what();
      return false;
    }
  };
  if (requested == "cuda_ipc") {
    if (!on_gpu) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ferry demo: transport 'cuda_ipc' needs the receiver on a GPU (--device cuda or "
           "cuda:N), not '{}'",
           device);
    }
    std::string why;
    if (!loadable("cuda_ipc", why)) {
      fail(FERRY_STATUS_NOT_FOUND, "ferry demo: transport 'cuda_ipc' is not available: {}", why);
    }
    return "cuda_ipc";
  }
  if (requested == "auto" || requested == "ucx") {
    std::string why;
    if (requested == "auto" && on_gpu) {
      if (loadable("cuda_ipc", why)) return "cuda_ipc";
      logger("demo")->info("CUDA IPC transport not available ({})", why);
    }
    if (loadable("ucx", why)) return "ucx";
    if (requested == "ucx") {
      fail(FERRY_STATUS_NOT_FOUND, "ferry demo: transport 'ucx' is not available: {}", why);
    }
    logger("demo")->info("UCX transport not available ({}); using disk", why);
    return "disk";
  }
  for (const char* later : {"nccl", "ckpt_engine"}) {
    if (requested == later) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "ferry demo cannot drive transport '{}' yet (available: cuda_ipc, ucx, inline, disk; "
           "'auto' picks the best)",
           requested);
    }
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "unknown transport '{}' (use auto, cuda_ipc, ucx, inline or disk)", requested);
}

}  // namespace ferry::demo
