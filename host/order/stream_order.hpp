// order/stream_order.hpp: stream ordering (docs/architecture.md, "Stream ordering"): ferry reads a trainer's
// CUDA tensors only after the work their producer queued on them is done, and writes an engine's
// parameters only after the engine's queued work on them is done.
//
// Contract:
//  - A StreamOrder names how to wait: synchronise the devices (the default: right for any
//    producer in the process, whatever stream it used), wait for everything queued on given
//    streams until the call (an event recorded on each, then waited for: the DLPack protocol's
//    meaning of a consumer stream), wait for given events, or nothing (the caller synchronised).
//  - Stream handles are cudaStream_t values: 0 is the default stream of the calling thread's
//    current device, 1 (cudaStreamLegacy) and 2 (cudaStreamPerThread) the special streams; such a
//    special handle is waited for on every device named by the caller (none named: the calling
//    thread's current device, if any). Any other stream is waited for on its own device.
//  - Waits block the calling thread. The calling thread's current CUDA device is restored
//    afterwards (a trainer's thread keeps its device).
//  - A build without CUDA: waiting on streams or events is UNIMPLEMENTED; with no CUDA devices
//    named and no handles given, nothing happens.
//
// Threading: wait() may run on any thread, concurrently with other waits. consumer_stream() is
// safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::order {

enum class Wait : std::uint32_t {
  sync_devices = 0,  // cudaDeviceSynchronize on every device named
  streams = 1,       // the work queued on `handles` (cudaStream_t) until the call
  events = 2,        // `handles` are cudaEvent_t recorded after the producing work
  none = 3,          // the caller made sure the memory is final
};

struct StreamOrder {
  Wait wait = Wait::sync_devices;
  std::vector<std::uintptr_t> handles;
};

// "sync_devices", "streams", ...
const char* wait_name(Wait wait);

// Checks a caller's order (INVALID_ARGUMENT naming `what`: an unknown wait, handles missing for
// streams / events, handles given with sync_devices or none).
StreamOrder checked_order(std::uint32_t wait, const void* const* handles, std::size_t count,
                          std::string_view what);

// Blocks until the work `order` names is done. `devices`: the CUDA devices of the memory about to
// be read or written (duplicates allowed); `what` names the operation for errors ("push of version
// 7"). IO naming the CUDA error and the handle when a wait fails.
void wait(const StreamOrder& order, std::span<const int> devices, std::string_view what);

// The same wait, taken later: what is queued on the streams is marked (an event recorded on
// each) when the Pending is made, on the caller's thread, and wait() blocks until that work,
// the devices' work (sync_devices) or the events are done. A push marks its producers' work
// when called and waits only when it is about to read a tensor, so that what it does before
// (its sessions' Begin round trips, copies queued but not launched) overlaps the producer's
// kernels. Construction throws what wait() would for a bad order (IO for a failed record,
// UNIMPLEMENTED without CUDA).
// Threading: wait() from any thread, once: the first call waits, concurrent ones block until
// it is done, later ones return at once or rethrow its failure.
class Pending {
 public:
  Pending(const StreamOrder& order, std::span<const int> devices, std::string what);
  ~Pending();
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  void wait();
  // How long wait() blocked (0 before it).
  double waited_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A stream ferry owns on `device` (created on first use, alive as long as the process) for the
// DLPack protocol: a consumer passes it to a producer's __dlpack__(stream=...), the producer orders
// its pending work before it, and the consumer then waits for it (Wait::streams). NOT_FOUND /
// UNIMPLEMENTED when the device or CUDA is missing.
std::uintptr_t consumer_stream(int device);

}  // namespace ferry::order
