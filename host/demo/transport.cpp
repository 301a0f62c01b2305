// demo/transport.cpp: the transport choice of `ferry demo` (see transport.hpp).
#include "demo/transport.hpp"

#include <ferry/sdk/error.hpp>

#include "common/log.hpp"
#include "session/transport_choice.hpp"
#include "store/store_device.hpp"

namespace ferry::demo {

DemoTransport choose_transport(const config::Config& config, const registry::Registry& registry) {
  const std::string& requested = config.demo.transport;
  if (requested == "disk" || requested == "inline") return {requested, false};
  session::TransportQuery q;
  q.requested = requested;
  q.preference = config.update.transport_preference;
  q.receiver = "the demo's receiver";
  q.receiver_on_this_host = true;      // a `ferry serve` child on this machine
  q.receiver_in_this_process = false;  // in its own process
  q.cuda_tensors = store::parse_store_device(config.demo.device).cuda;
  const session::TransportChoice choice = session::choose_transport(
      q, [&](const std::string& name) { return session::transport_facts(registry, name); });
  DemoTransport out{choice.name, false};
  if (choice.name == "inline") {
    logger("demo")->info("transport {}", choice.why);
    return out;
  }
  const session::TransportFacts facts = session::transport_facts(registry, choice.name);
  if (!facts.loadable) {
    fail(FERRY_STATUS_NOT_FOUND, "ferry demo: transport '{}' is not available: {}", choice.name,
         facts.error);
  }
  if (!(facts.flags & FERRY_TRANSPORT_CAP_POINT_TO_POINT)) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "ferry demo drives point-to-point pushes only; transport '{}' is not one (use 'auto', "
         "'inline', 'disk' or a point-to-point plugin)",
         choice.name);
  }
  if (const std::string misfit = session::transport_misfit(q, facts); !misfit.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "ferry demo: transport '{}' cannot serve it: {}",
         choice.name, misfit);
  }
  out.device_tensors = q.cuda_tensors && (facts.memory_kinds & FERRY_MEMORY_CUDA) != 0;
  logger("demo")->info("transport {}", choice.why);
  return out;
}

}  // namespace ferry::demo
