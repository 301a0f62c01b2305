// ckpt_engine/worker_session.hpp: the worker side of one checkpoint-engine update as a state
// machine over message bytes: it decodes each message, checks it is legal in the current phase
// and tells the transport what to do next. No sockets, no CUDA: the transport owns those.
//
// Use (one ZMQ REP socket per update, see PROTOCOL.md):
//   WorkerSession session;
//   loop: bytes = recv(); step = session.next(bytes);
//         do step.action (map the buffer / copy the bucket / unmap / post-process);
//         send(success_reply()) or send(failure_reply(error));
//   until session.finished() or step.action == abort (then stop; the sender gave up).
// After a failed map_buffer the worker sends the error text, waits for one more message (the
// sender's acknowledgement) and ends, as checkpoint-engine's own worker does.
//
// Threading: a WorkerSession is used by one thread at a time.
#pragma once

#include "ckpt_engine/messages.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ferry::ckpt_engine {

enum class WorkerAction : std::uint8_t {
  map_buffer,      // open step.handle (cudaIpcOpenMemHandle on this worker's device)
  apply_bucket,    // copy step.bucket's tensors out of the mapped buffer, then synchronize
  release_buffer,  // unmap the buffer (first None); reply, then wait for the final None
  finish,          // post-process (final None); reply; the update is complete
  abort,           // the sender aborted (step.abort); do not reply; fail the update
};

const char* worker_action_name(WorkerAction action) noexcept;

struct WorkerStep {
  WorkerAction action = WorkerAction::abort;
  IpcBufferHandle handle;  // map_buffer
  BucketMeta bucket;       // apply_bucket: validated against the buffer size
  AbortRequest abort;      // abort
};

struct WorkerSessionOptions {
  // checkpoint-engine 0.4.2 ends an update with two None messages (release, then
  // post-process). Older releases sent one None meaning "post-process and finish"; set false
  // to speak to those.
  bool release_before_finish = true;
  PickleLimits limits;
};

class WorkerSession {
 public:
  enum class Phase : std::uint8_t { awaiting_handle, streaming, released, finished, aborted };

  explicit WorkerSession(WorkerSessionOptions options = {}) : options_(std::move(options)) {}

  // Decodes the next message and advances the phase. Throws ferry::Error:
  // CORRUPT_DATA when the pickle or its contents are refused, INCOMPATIBLE when the message is
  // not legal in this phase (e.g. a bucket before the IPC handle), FAILED_PRECONDITION when
  // called after the session finished or aborted. A throw leaves the phase unchanged.
  WorkerStep next(std::span<const std::uint8_t> message);

  Phase phase() const noexcept { return phase_; }
  bool finished() const noexcept { return phase_ == Phase::finished; }
  // Buckets applied so far in this update.
  std::uint64_t buckets() const noexcept { return buckets_; }
  // Size of the mapped buffer (0 before the handle arrived).
  std::uint64_t buffer_bytes() const noexcept { return buffer_bytes_; }

 private:
  WorkerSessionOptions options_;
  Phase phase_ = Phase::awaiting_handle;
  std::uint64_t buckets_ = 0;
  std::uint64_t buffer_bytes_ = 0;
};

const char* worker_phase_name(WorkerSession::Phase phase) noexcept;

// What the worker sends back: an empty message on success, the error text otherwise (the
// ParameterServer logs it and aborts every worker).
inline std::string_view success_reply() noexcept { return {}; }
std::string failure_reply(std::string_view what);

}  // namespace ferry::ckpt_engine
