// session/transport_choice.hpp: which data transport a sender uses for one receiver ("inline", a
// plugin named by the user, or for "auto" the first plugin of the configured preference list
// whose declared capabilities fit the push and the receiver), and the rules that refuse a named
// plugin before anything connects (a same-node-only transport and a receiver on another host; a
// separate-processes transport and a receiver in this process). The host names no plugin here:
// every rule reads capability bits. Pure decisions over what the caller found out (plugin
// loadable, its capabilities, where the receiver is), so they are tested without plugins, GPUs
// or peers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ferry::registry {
class Registry;
}

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
  // The plugins "auto" tries, in order (config update.transport_preference); after them, inline.
  std::vector<std::string> preference;
  std::string receiver;       // "HOST:PORT" as the user gave it (for messages)
  bool receiver_on_this_host = false;
  // The receiver is embedded in this very process: CUDA IPC cannot serve it (a process cannot
  // open the IPC handles it made itself).
  bool receiver_in_this_process = false;
  bool cuda_tensors = false;  // every tensor of the push is in CUDA memory
};

// Why a loadable transport with `facts` cannot carry this push to this receiver, or empty when it
// can: it must be point-to-point; SAME_NODE_ONLY needs a receiver on this host;
// SEPARATE_PROCESSES a receiver in another process; a transport that reads device memory only
// needs CUDA tensors (host staging covers the other way: device tensors through a host-memory
// transport).
std::string transport_misfit(const TransportQuery& query, const TransportFacts& facts);

// The choice for one receiver. `facts(name)` is asked only for plugins the choice depends on.
// A requested plugin: throws ferry::Error INCOMPATIBLE naming the receiver and the rule when it
// is same-node only and the receiver is not on this host, or separate-processes only and the
// receiver is in this process (one that cannot be loaded is reported by its data path).
// "auto": the first plugin of `preference` that loads and fits (transport_misfit), else inline;
// `why` says what was passed over and why.
TransportChoice choose_transport(const TransportQuery& query,
                                 const std::function<TransportFacts(const std::string&)>& facts);

// What `registry` says about the transport plugin `name` (loading it if needed): its flags and
// memory kinds, or why it cannot be loaded.
TransportFacts transport_facts(const registry::Registry& registry, const std::string& name);

// True when `host` (a name or numeric address from "HOST:PORT") names this machine: a loopback
// name or address, this host's name, or an address of one of its interfaces. No DNS lookups.
bool is_this_host(const std::string& host);

}  // namespace ferry::session
