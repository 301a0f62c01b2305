// ckpt_engine/worker_session.cpp: the worker-side phase machine of one checkpoint-engine update.
#include "ckpt_engine/worker_session.hpp"

#include <ferry/sdk/error.hpp>

#include <utility>
#include <variant>

namespace ferry::ckpt_engine {

const char* worker_action_name(WorkerAction action) noexcept {
  switch (action) {
    case WorkerAction::map_buffer: return "map_buffer";
    case WorkerAction::apply_bucket: return "apply_bucket";
    case WorkerAction::release_buffer: return "release_buffer";
    case WorkerAction::finish: return "finish";
    case WorkerAction::abort: return "abort";
  }
  return "unknown";
}

const char* worker_phase_name(WorkerSession::Phase phase) noexcept {
  switch (phase) {
    case WorkerSession::Phase::awaiting_handle: return "awaiting the IPC handle";
    case WorkerSession::Phase::streaming: return "receiving buckets";
    case WorkerSession::Phase::released: return "buffer released, awaiting the final None";
    case WorkerSession::Phase::finished: return "finished";
    case WorkerSession::Phase::aborted: return "aborted";
  }
  return "unknown";
}

std::string failure_reply(std::string_view what) {
  // An empty reply means success to the ParameterServer, so a failure is never empty.
  if (what.empty()) return "ferry worker failed (no message)";
  return std::string(what);
}

WorkerStep WorkerSession::next(std::span<const std::uint8_t> message) {
  if (phase_ == Phase::finished || phase_ == Phase::aborted) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "checkpoint-engine session: message after the update {}",
         worker_phase_name(phase_));
  }
  Message decoded = decode_message(message, options_.limits);
  const auto illegal = [&](const char* what) {
    fail(FERRY_STATUS_INCOMPATIBLE, "checkpoint-engine session: {} received while {}", what,
         worker_phase_name(phase_));
  };

  WorkerStep step;
  if (auto* handle = std::get_if<IpcBufferHandle>(&decoded)) {
    if (phase_ != Phase::awaiting_handle) illegal("a second IPC handle");
    step.action = WorkerAction::map_buffer;
    step.handle = std::move(*handle);
    buffer_bytes_ = step.handle.buffer_bytes();
    phase_ = Phase::streaming;
  } else if (auto* bucket = std::get_if<BucketMeta>(&decoded)) {
    if (phase_ != Phase::streaming) illegal("a bucket");
    check_bucket_in_buffer(*bucket, buffer_bytes_);
    step.action = WorkerAction::apply_bucket;
    step.bucket = std::move(*bucket);
    ++buckets_;
  } else if (std::holds_alternative<EndSignal>(decoded)) {
    if (phase_ == Phase::streaming && options_.release_before_finish) {
      step.action = WorkerAction::release_buffer;
      phase_ = Phase::released;
    } else if (phase_ == Phase::streaming || phase_ == Phase::released) {
      step.action = WorkerAction::finish;
      phase_ = Phase::finished;
    } else {
      illegal("the end signal (None)");
    }
  } else {
    // The sender only aborts while buckets stream; accept it in any open phase so a worker
    // never waits for a message that will not come.
    step.action = WorkerAction::abort;
    step.abort = std::get<AbortRequest>(std::move(decoded));
    phase_ = Phase::aborted;
  }
  return step;
}

}  // namespace ferry::ckpt_engine
