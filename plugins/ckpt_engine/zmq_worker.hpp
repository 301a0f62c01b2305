// ckpt_engine/zmq_worker.hpp: the worker side of one checkpoint-engine update on a ZMQ REP
// socket: it receives the ParameterServer's messages with deadlines, decodes them with the
// restricted reader (WorkerSession), copies each bucket out of the sender's shared buffer and
// answers every message the way the protocol expects (PROTOCOL.md).
//
// The one step that needs a GPU, opening the CUDA IPC handle, is behind SharedBufferOpener
// (cuda_buffer.hpp in the transport; host memory in tests).
//
// Use, one object per update:
//   ZmqWorker worker(address, opener, options);
//   worker.open_buffer();                 // IPC handle -> mapped; answer owed
//   while (auto b = worker.next_bucket(dst, capacity)) apply(dst, b->manifest);  // answers the
//                                         // previous message "success" before receiving
//   worker.conclude();                    // answers the final None: empty, or the reason given
//                                         // to abandon(); then drains the sender's abort
// On a failure the host calls abandon(reason) before conclude() (or lets the destructor do it).
//
// Threading: one thread drives open_buffer/next_bucket/conclude; abandon() may be called from any
// thread and wakes a blocked receive within ~50 ms.
#pragma once

#include "ckpt_engine/worker_session.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ferry::ckpt_engine {

// Makes the sender's shared buffer readable in this process.
class SharedBufferOpener {
 public:
  virtual ~SharedBufferOpener() = default;
  // Opens `handle` on this worker's own device (never the sender's device index) and returns
  // the first byte of the buffer (storage and tensor offsets applied). Throws ferry::Error.
  virtual const std::byte* open(const IpcBufferHandle& handle) = 0;
  // Releases what open() opened (IPC mapping, torch's reference count). Idempotent.
  virtual void close() noexcept = 0;
  // Copies `bytes` bytes from `src` (inside the open buffer) to `dst` (host or device memory of
  // this worker) and returns when the copy is complete, so the sender may overwrite `src`.
  virtual void copy_out(void* dst, const std::byte* src, std::uint64_t bytes) = 0;
};

struct ZmqWorkerOptions {
  // Longest wait for any one message of the ParameterServer.
  std::chrono::milliseconds receive_timeout{120000};
  // After an error answer: how long to wait for each of the sender's closing messages
  // (RuntimeError, or the None messages it still sends) so it is never left blocked.
  std::chrono::milliseconds abort_grace{10000};
  // Largest message accepted (ZMQ_MAXMSGSIZE); a bucket list of 10^5 tensors is ~10 MB.
  std::int64_t max_message_bytes = 256ll << 20;
  WorkerSessionOptions session;
};

// One bucket copied out of the shared buffer into the caller's memory.
struct ReceivedBucket {
  std::vector<std::uint8_t> manifest;  // tensor_meta.capnp Manifest; offsets relative to dst
  std::uint64_t bytes = 0;             // bytes written to dst
  std::uint32_t index = 0;             // 0, 1, ... in arrival order
  std::size_t tensors = 0;
};

class ZmqWorker {
 public:
  // Connects a REP socket to `address` (e.g. "ipc://@checkpoint-engine-GPU-...-0.sock").
  // Throws ferry::Error(INVALID_ARGUMENT) for an address ZMQ refuses.
  ZmqWorker(std::string address, std::unique_ptr<SharedBufferOpener> opener,
            ZmqWorkerOptions options = {});
  // Answers an owed message (with the abandon reason, or "abandoned" when none was given),
  // drains the sender's closing messages and closes the socket.
  ~ZmqWorker();
  ZmqWorker(const ZmqWorker&) = delete;
  ZmqWorker& operator=(const ZmqWorker&) = delete;

  // Receives the IPC handle (the first message) and opens it. Returns the largest bucket the
  // sender can send (half its double buffer). The answer is owed until next_bucket/conclude.
  // Throws: TIMEOUT / PEER_FAILED naming the sender and the phase, CORRUPT_DATA / INCOMPATIBLE
  // for a refused message (the sender got the error text), the opener's error.
  // `deadline_ns`: CLOCK_MONOTONIC ns, <= 0 for none (receive_timeout applies either way).
  std::uint64_t open_buffer(std::int64_t deadline_ns = 0);

  // Answers the previous message "success", then receives until the next bucket (answering the
  // release None on the way) and copies it into dst[0, capacity). Returns nullopt at the final
  // None (its answer is owed to conclude()). Throws as open_buffer, plus ABORTED when the
  // sender aborted or abandon() was called, INVALID_ARGUMENT when the bucket exceeds capacity.
  std::optional<ReceivedBucket> next_bucket(void* dst, std::uint64_t capacity,
                                            std::int64_t deadline_ns = 0);

  // Answers the owed message: empty when nothing was abandoned, else the reason; then closes.
  void conclude();

  // Marks the update failed with `reason` (first reason wins). Any thread.
  void abandon(const std::string& reason);

  const std::string& address() const noexcept { return address_; }
  std::uint64_t buckets() const noexcept { return session_.buckets(); }

 private:
  // `honour_abandon`: fail with ABORTED once abandon() was called (not while draining).
  std::vector<std::uint8_t> receive(const std::string& waiting_for, std::int64_t deadline_ns,
                                    std::chrono::milliseconds timeout, bool honour_abandon = true);
  void answer(const std::string& text);
  void answer_failure(const std::string& text);
  // After an error answer: receives and answers what the sender still sends, then stops.
  void drain(const std::string& text) noexcept;
  std::string abandon_reason() const;

  struct Sockets;
  std::string address_;
  std::unique_ptr<SharedBufferOpener> opener_;
  ZmqWorkerOptions options_;
  std::unique_ptr<Sockets> sockets_;
  WorkerSession session_;
  const std::byte* buffer_ = nullptr;
  bool answer_owed_ = false;
  bool peer_gone_ = false;
  bool concluded_ = false;
  std::atomic<bool> abandoned_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;  // guarded by reason_mutex_
};

}  // namespace ferry::ckpt_engine
