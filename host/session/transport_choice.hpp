// session/transport_choice.hpp: which data transport a sender uses for one receiver ("inline", a
// plugin named by the user, or the best one for "auto"), and the same-node rule of device
// transports (cuda_ipc): a receiver on another host is refused before anything connects.
// Pure decisions over what the caller found out (plugin loadable, its capabilities, where the
// receiver is), so that they are tested without plugins, GPUs or peers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace ferry::session {

// What the registry says about a transport plugin: nullopt when it cannot be loaded (the
// reason in `error`), else its capability flags (ferry_transport_cap_t bits) and memory kinds.
struct TransportFacts {
  bool loadable = false;
  std::string error;
  std::uint32_t flags = 0;
  std::uint32_t memory_kinds = 0;
};

struct TransportChoice {
  std::string name;       // "inline" or a plugin name
  bool required = true;   // false: chosen by "auto"; the receiver may answer "inline"
  std::string why;        // one line for the log
};

struct TransportQuery {
  std::string requested;      // "auto", "inline" or a plugin name
  std::string receiver;       // "HOST:PORT" as the user gave it (for messages)
  bool receiver_on_this_host = false;
  // The receiver is embedded in this very process: CUDA IPC cannot serve it (a process cannot
  // open the IPC handles it made itself).
  bool receiver_in_this_process = false;
  bool cuda_tensors = false;  // every tensor of the push is in CUDA memory
};

// The choice for one receiver. `facts(name)` is asked only for plugins the choice depends on.
// Throws ferry::Error INCOMPATIBLE naming the receiver and the rule when the requested plugin is
// same-node only (FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) and the receiver is not on this host.
// "auto": cuda_ipc when the tensors are on a GPU, the receiver is on this host but not in this
// process, and cuda_ipc loads; else ucx when it loads; else inline. `why` says what was passed
// over and why. A requested cuda_ipc with a receiver in this process is INCOMPATIBLE.
TransportChoice choose_transport(const TransportQuery& query,
                                 const std::function<TransportFacts(const std::string&)>& facts);

// True when `host` (a name or numeric address from "HOST:PORT") names this machine: a loopback
// name or address, this host's name, or an address of one of its interfaces. No DNS lookups.
bool is_this_host(const std::string& host);

}  // namespace ferry::session
