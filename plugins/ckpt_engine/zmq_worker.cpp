// ckpt_engine/zmq_worker.cpp: one checkpoint-engine update on a ZMQ REP socket (zmq_worker.hpp).
#include "ckpt_engine/zmq_worker.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <utility>

namespace ferry::ckpt_engine {
namespace {

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr auto kPollSlice = std::chrono::milliseconds(50);

std::atomic<std::uint64_t> monitor_counter{0};

}  // namespace

// The REP socket and a monitor on it: the monitor reports the ParameterServer's disconnect
// (its process died or closed the socket), so a dead sender fails the update at once instead of
// at the deadline.
struct ZmqWorker::Sockets {
  zmq::context_t context{1};
  zmq::socket_t rep{context, zmq::socket_type::rep};
  zmq::socket_t monitor{context, zmq::socket_type::pair};
};

ZmqWorker::ZmqWorker(std::string address, std::unique_ptr<SharedBufferOpener> opener,
                     ZmqWorkerOptions options)
    : address_(std::move(address)),
      opener_(std::move(opener)),
      options_(std::move(options)),
      sockets_(std::make_unique<Sockets>()),
      session_(options_.session) {
  auto& s = *sockets_;
  try {
    s.rep.set(zmq::sockopt::linger, 0);
    s.rep.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
    s.rep.set(zmq::sockopt::sndtimeo, 1000);
    const std::string monitor_address =
        "inproc://ferry-ckpt-monitor-" + std::to_string(monitor_counter.fetch_add(1));
    if (zmq_socket_monitor(s.rep.handle(), monitor_address.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    s.monitor.set(zmq::sockopt::linger, 0);
    s.monitor.connect(monitor_address);
    s.rep.connect(address_);
  } catch (const zmq::error_t& e) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "checkpoint-engine: cannot connect to '{}': {}", address_,
         e.what());
  }
}

ZmqWorker::~ZmqWorker() {
  if (!concluded_) {
    try {
      conclude();
    } catch (...) {
      // conclude() only throws for ZMQ faults; nothing more can be done in a destructor.
    }
  }
  if (opener_) opener_->close();
  if (sockets_) {
    zmq_socket_monitor(sockets_->rep.handle(), nullptr, 0);
    sockets_->monitor.close();
    sockets_->rep.close();
  }
}

void ZmqWorker::abandon(const std::string& reason) {
  std::lock_guard lock(reason_mutex_);
  if (reason_.empty()) reason_ = reason.empty() ? "the ferry receiver abandoned the update" : reason;
  abandoned_.store(true);
}

std::string ZmqWorker::abandon_reason() const {
  std::lock_guard lock(reason_mutex_);
  return reason_;
}

std::vector<std::uint8_t> ZmqWorker::receive(const std::string& waiting_for,
                                             std::int64_t deadline_ns,
                                             std::chrono::milliseconds timeout,
                                             bool honour_abandon) {
  auto& s = *sockets_;
  std::int64_t limit = monotonic_ns() + std::chrono::nanoseconds(timeout).count();
  if (deadline_ns > 0) limit = std::min(limit, deadline_ns);
  for (;;) {
    if (honour_abandon && abandoned_.load()) {
      fail(FERRY_STATUS_ABORTED, "checkpoint-engine update at {} abandoned while waiting for {}: {}",
           address_, waiting_for, abandon_reason());
    }
    if (peer_gone_) {
      // A message the sender queued before it went away is still delivered.
      zmq::message_t message;
      if (s.rep.recv(message, zmq::recv_flags::dontwait)) {
        const auto* p = static_cast<const std::uint8_t*>(message.data());
        return std::vector<std::uint8_t>(p, p + message.size());
      }
      fail(FERRY_STATUS_PEER_FAILED,
           "the checkpoint-engine ParameterServer at {} disconnected while the worker waited for "
           "{}",
           address_, waiting_for);
    }
    const std::int64_t left = limit - monotonic_ns();
    if (left <= 0) {
      fail(FERRY_STATUS_TIMEOUT,
           "no message from the checkpoint-engine ParameterServer at {} within {} ms while the "
           "worker waited for {}",
           address_, timeout.count(), waiting_for);
    }
    const auto slice = std::min<std::chrono::milliseconds>(
        kPollSlice, std::chrono::milliseconds(left / 1'000'000 + 1));
    zmq::pollitem_t items[] = {{s.rep.handle(), 0, ZMQ_POLLIN, 0},
                               {s.monitor.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, slice);
    if ((items[0].revents & ZMQ_POLLIN) != 0) {
      zmq::message_t message;
      if (s.rep.recv(message, zmq::recv_flags::dontwait)) {
        const auto* p = static_cast<const std::uint8_t*>(message.data());
        return std::vector<std::uint8_t>(p, p + message.size());
      }
    }
    if ((items[1].revents & ZMQ_POLLIN) != 0) {
      // A monitor event is two frames: {u16 event, u32 value}, then the endpoint.
      zmq::message_t event;
      zmq::message_t endpoint;
      if (s.monitor.recv(event, zmq::recv_flags::dontwait)) {
        (void)s.monitor.recv(endpoint, zmq::recv_flags::dontwait);
        std::uint16_t id = 0;
        if (event.size() >= sizeof(id)) std::memcpy(&id, event.data(), sizeof(id));
        if (id == ZMQ_EVENT_DISCONNECTED) peer_gone_ = true;
      }
    }
  }
}

void ZmqWorker::answer(const std::string& text) {
  answer_owed_ = false;
  if (peer_gone_) return;
  try {
    if (!sockets_->rep.send(zmq::buffer(text), zmq::send_flags::none)) {
      peer_gone_ = true;
    }
  } catch (const zmq::error_t& e) {
    fail(FERRY_STATUS_PEER_FAILED, "checkpoint-engine: cannot answer the ParameterServer at {}: {}",
         address_, e.what());
  }
}

void ZmqWorker::answer_failure(const std::string& text) {
  abandon(text);
  try {
    answer(failure_reply(text));
  } catch (...) {
    // The sender is gone; the caller reports the original failure.
  }
  drain(text);
}

void ZmqWorker::drain(const std::string& text) noexcept {
  // checkpoint-engine's ParameterServer answers an error to a bucket with RuntimeError and
  // stops; after the last bucket it does not check answers and still sends None twice, each
  // waiting for an answer. Answer those with the error so it is never left blocked.
  int nones_left = session_.phase() == WorkerSession::Phase::finished   ? 0
                   : session_.phase() == WorkerSession::Phase::released ? 1
                                                                          : 2;
  for (int i = 0; i < 3 && nones_left > 0 && !peer_gone_; ++i) {
    std::vector<std::uint8_t> message;
    try {
      message = receive("the sender's closing message", 0, options_.abort_grace, false);
    } catch (...) {
      return;
    }
    Message decoded;
    try {
      decoded = decode_message(message, options_.session.limits);
    } catch (...) {
      decoded = EndSignal{};  // unknown: answer it with the error like a None
    }
    if (std::holds_alternative<AbortRequest>(decoded)) return;  // no answer expected
    if (std::holds_alternative<EndSignal>(decoded)) --nones_left;
    try {
      answer(failure_reply(text));
    } catch (...) {
      return;
    }
  }
}

std::uint64_t ZmqWorker::open_buffer(std::int64_t deadline_ns) {
  if (session_.phase() != WorkerSession::Phase::awaiting_handle) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "checkpoint-engine: the IPC handle was received already");
  }
  auto bytes = receive("the IPC handle of the shared buffer", deadline_ns,
                       options_.receive_timeout);
  WorkerStep step;
  bool sender_aborted = false;
  try {
    step = session_.next(bytes);
    if (step.action == WorkerAction::abort) {
      sender_aborted = true;
      fail(FERRY_STATUS_ABORTED,
           "the checkpoint-engine ParameterServer at {} aborted the update: {}: {}", address_,
           step.abort.exception, step.abort.text);
    }
    buffer_ = opener_->open(step.handle);
  } catch (const Error& e) {
    if (!sender_aborted) {
      answer_failure(fmt::format("ferry worker: the IPC handle was refused: {}", e.what()));
    }
    throw;
  }
  answer_owed_ = true;
  return (step.handle.buffer_bytes() + 1) / 2;
}

std::optional<ReceivedBucket> ZmqWorker::next_bucket(void* dst, std::uint64_t capacity,
                                                     std::int64_t deadline_ns) {
  if (buffer_ == nullptr && session_.phase() == WorkerSession::Phase::awaiting_handle) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "checkpoint-engine: next_bucket before open_buffer");
  }
  if (abandoned_.load()) {
    fail(FERRY_STATUS_ABORTED, "checkpoint-engine update at {} abandoned: {}", address_,
         abandon_reason());
  }
  for (;;) {
    if (answer_owed_) answer(std::string(success_reply()));
    const std::string waiting_for =
        session_.phase() == WorkerSession::Phase::released
            ? std::string("the final None (post-processing)")
            : fmt::format("bucket {} or the end signal", session_.buckets());
    auto bytes = receive(waiting_for, deadline_ns, options_.receive_timeout);
    WorkerStep step;
    try {
      step = session_.next(bytes);
    } catch (const Error& e) {
      answer_failure(fmt::format("ferry worker: message refused while waiting for {}: {}",
                                 waiting_for, e.what()));
      throw Error(e.code(), fmt::format("checkpoint-engine message from {} refused: {}", address_,
                                        e.what()));
    }
    switch (step.action) {
      case WorkerAction::apply_bucket: {
        const std::uint64_t size = step.bucket.end - step.bucket.begin;
        const std::uint32_t index = static_cast<std::uint32_t>(session_.buckets() - 1);
        try {
          if (size > capacity) {
            fail(FERRY_STATUS_INVALID_ARGUMENT,
                 "bucket {} spans {} bytes but the receiver's staging holds {}", index, size,
                 capacity);
          }
          manifest::Manifest m;
          m.bucket_index = index;
          m.bucket_count = index + 1;  // the protocol does not say how many buckets follow
          m.bucket_bytes = size;
          m.tensors.reserve(step.bucket.tensors.size());
          for (const auto& t : step.bucket.tensors) {
            manifest::Entry e;
            e.name = t.name;
            e.dtype = t.dtype;
            e.shape = t.shape;
            e.offset = t.offset - step.bucket.begin;
            e.size = t.bytes;
            m.tensors.push_back(std::move(e));
          }
          // The sender packs in order, but sort anyway: manifests require offset order.
          std::stable_sort(m.tensors.begin(), m.tensors.end(),
                           [](const auto& a, const auto& b) { return a.offset < b.offset; });
          ReceivedBucket out;
          out.manifest = manifest::encode(m);
          if (size > 0) opener_->copy_out(dst, buffer_ + step.bucket.begin, size);
          out.bytes = size;
          out.index = index;
          out.tensors = m.tensors.size();
          answer_owed_ = true;
          return out;
        } catch (const Error& e) {
          answer_failure(fmt::format("ferry worker: bucket {} failed: {}", index, e.what()));
          throw;
        }
      }
      case WorkerAction::release_buffer:
        opener_->close();
        buffer_ = nullptr;
        answer_owed_ = true;  // answered at the top of the loop
        continue;
      case WorkerAction::finish:
        opener_->close();
        buffer_ = nullptr;
        answer_owed_ = true;
        return std::nullopt;
      case WorkerAction::abort:
        fail(FERRY_STATUS_ABORTED,
             "the checkpoint-engine ParameterServer at {} aborted the update: {}: {}", address_,
             step.abort.exception, step.abort.text);
      case WorkerAction::map_buffer:
        break;  // WorkerSession refuses a second handle
    }
    fail(FERRY_STATUS_INTERNAL, "checkpoint-engine: unexpected step {}",
         worker_action_name(step.action));
  }
}

void ZmqWorker::conclude() {
  if (concluded_) return;
  concluded_ = true;
  if (answer_owed_ && !session_.finished() && !abandoned_.load()) {
    abandon("the ferry receiver closed the update before the sender's end signal");
  }
  if (answer_owed_) {
    if (abandoned_.load()) {
      const std::string reason = abandon_reason();
      try {
        answer(failure_reply(reason));
      } catch (...) {
        // The sender is gone.
      }
      drain(reason);
    } else {
      answer(std::string(success_reply()));
    }
  }
  opener_->close();
  buffer_ = nullptr;
}

}  // namespace ferry::ckpt_engine
