// torch_gloo/gloo_backend.hpp: the part of the torch_gloo transport that links libtorch, as the
// plugin's entry (torch_gloo_transport.cpp) sees it. It lives in its own shared object,
// libferry_torch_gloo_backend.so beside the plugin, loaded at the first connect: a ferry process
// that never joins a gloo group never loads libtorch (the registry loads every plugin it finds).
//
// Nothing crosses this boundary as an exception: every call is noexcept and reports through an
// Outcome (both objects are built by the same compiler from this tree; the backend is never
// unloaded, so its objects may be destroyed at any time).
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry::torch_gloo {

struct Outcome {
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
  bool ok() const { return code == FERRY_STATUS_OK; }
};

// How to meet a group created by torch.distributed (rank 0's TCPStore and the store keys its
// process group uses).
struct JoinArgs {
  std::string host;         // rank 0's TCPStore
  std::uint16_t port = 0;
  std::string group_name;
  std::uint32_t rank = 0;   // 0 serves the store (a trainer played by ferry, in tests)
  std::uint32_t world_size = 0;
  // The key prefixes between the TCPStore and the process group, outermost first ("{group}"
  // stands for the group name). Empty: the chain SGLang's init_custom_process_group builds with
  // the torch this backend was built against (default_prefixes()).
  std::vector<std::string> prefixes;
  std::string interface;    // network interface for gloo's pairs; empty: the default device
  std::chrono::milliseconds timeout{120000};  // store, mesh and every broadcast
};

// One broadcast in flight.
class PendingBroadcast {
 public:
  virtual ~PendingBroadcast() = default;
  // Waits up to `slice`: true when the broadcast finished (outcome says how), false when it
  // still runs.
  virtual bool wait_for(std::chrono::milliseconds slice, Outcome& outcome) noexcept = 0;
};

// A joined group: rank 0 sends, the others receive, one collective per call.
class Group {
 public:
  // Joins the process group's threads: returns once every broadcast ended (each is bounded by
  // JoinArgs::timeout).
  virtual ~Group() = default;
  // Starts the broadcast of `bytes` at `data` from rank 0 (in place on every rank). nullptr with
  // the outcome set when it could not start.
  virtual std::unique_ptr<PendingBroadcast> broadcast(std::uint8_t* data, std::uint64_t bytes,
                                                      Outcome& outcome) noexcept = 0;
  virtual std::string describe() const = 0;  // "torch 1.13.1 gloo group 'g' rank 1/2"
};

// The backend's entry: joins (blocks until every rank joined or the timeout passed).
using JoinFn = std::unique_ptr<Group> (*)(const JoinArgs& args, Outcome& outcome) noexcept;
inline constexpr const char* kJoinSymbol = "ferry_torch_gloo_join_v1";
inline constexpr const char* kBackendFile = "libferry_torch_gloo_backend.so";

}  // namespace ferry::torch_gloo
