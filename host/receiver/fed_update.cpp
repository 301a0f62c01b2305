// receiver/fed_update.cpp: an update fed bucket by bucket by its caller, run by a thread that
// holds the update lock (see fed_update.hpp).
#include "receiver/fed_update.hpp"

#include <ferry/sdk/error.hpp>

#include <condition_variable>
#include <exception>
#include <mutex>

#include "common/log.hpp"

namespace ferry::receiver {

// What the caller and the update's thread share, under `mutex`.
struct FedUpdate::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  bool started = false;      // the update lock is held and the update began
  bool over = false;         // the thread's update ended (report or error set)
  std::optional<update::Bucket> handed;  // the bucket the caller handed over, not yet taken
  std::uint64_t handed_count = 0;
  std::uint64_t applied_count = 0;
  bool ending = false;       // finish(): no more buckets
  std::optional<std::string> label;
  std::optional<std::string> abort_reason;
  std::exception_ptr error;
  UpdateReport report;
  std::uint64_t version = 0;
};

// The update loop's source: the buckets the caller hands over.
class FedUpdate::Source final : public update::BucketSource {
 public:
  Source(Shared& s, std::chrono::milliseconds idle_timeout) : s_(s), idle_timeout_(idle_timeout) {}

  void begun() override {
    const std::lock_guard lock(s_.mutex);
    s_.started = true;
    s_.changed.notify_all();
  }

  bool next(std::uint32_t, update::Bucket& out) override {
    std::unique_lock lock(s_.mutex);
    const bool woke = s_.changed.wait_for(lock, idle_timeout_, [&] {
      return s_.handed.has_value() || s_.ending || s_.abort_reason.has_value();
    });
    if (s_.abort_reason) fail(FERRY_STATUS_ABORTED, "{}", *s_.abort_reason);
    if (!woke) {
      fail(FERRY_STATUS_TIMEOUT,
           "no tensors came for {} ms (update.staged_tensors_timeout_ms) and the update was "
           "never completed",
           idle_timeout_.count());
    }
    if (!s_.handed) return false;  // ending
    out = std::move(*s_.handed);
    s_.handed.reset();
    return true;
  }

  void applied(const update::Bucket&) override {
    const std::lock_guard lock(s_.mutex);
    ++s_.applied_count;
    s_.changed.notify_all();
  }

  update::UpdateEnd end() override {
    const std::lock_guard lock(s_.mutex);
    update::UpdateEnd e;
    e.label = s_.label;
    return e;
  }

 private:
  Shared& s_;
  std::chrono::milliseconds idle_timeout_;
};

FedUpdate::FedUpdate(Receiver& receiver, std::span<const ferry_tensor_desc_t> catalog,
                     std::chrono::milliseconds idle_timeout)
    : s_(std::make_shared<Shared>()) {
  // The update lock is a mutex: taken and given back by the thread that runs the update.
  thread_ = std::thread([&receiver, catalog, idle_timeout, s = s_] {
    try {
      auto update = receiver.open_session(catalog, std::string());
      const std::uint64_t version = receiver.version().number + 1;
      {
        const std::lock_guard lock(s->mutex);
        s->version = version;
      }
      Source source(*s, idle_timeout);
      UpdateReport report = update->run(source, version, std::nullopt);
      update.reset();
      const std::lock_guard lock(s->mutex);
      s->report = report;
      s->over = true;
    } catch (...) {
      const std::lock_guard lock(s->mutex);
      s->error = std::current_exception();
      s->over = true;
    }
    s->changed.notify_all();
  });
  std::unique_lock lock(s_->mutex);
  s_->changed.wait(lock, [&] { return s_->started || s_->over; });
  if (!s_->started) {
    const auto error = s_->error;
    lock.unlock();
    thread_.join();
    std::rethrow_exception(error);
  }
  version_ = s_->version;
}

FedUpdate::~FedUpdate() {
  if (thread_.joinable()) abort("the update was dropped before it was completed");
}

bool FedUpdate::over() const {
  const std::lock_guard lock(s_->mutex);
  return s_->over;
}

void FedUpdate::apply(update::Bucket bucket) {
  std::unique_lock lock(s_->mutex);
  if (s_->over || s_->ending) {
    if (s_->error) std::rethrow_exception(s_->error);
    fail(FERRY_STATUS_FAILED_PRECONDITION, "the update {} is over", version_);
  }
  s_->handed = std::move(bucket);
  const std::uint64_t mine = ++s_->handed_count;
  s_->changed.notify_all();
  s_->changed.wait(lock, [&] { return s_->applied_count >= mine || s_->over; });
  if (s_->applied_count >= mine) return;
  s_->handed.reset();
  if (s_->error) std::rethrow_exception(s_->error);
  fail(FERRY_STATUS_INTERNAL, "the update {} ended before its bucket was applied", version_);
}

void FedUpdate::wait_over() {
  {
    std::unique_lock lock(s_->mutex);
    s_->changed.wait(lock, [&] { return s_->over; });
  }
  if (thread_.joinable()) thread_.join();
}

UpdateReport FedUpdate::finish(const std::optional<std::string>& label) {
  {
    const std::lock_guard lock(s_->mutex);
    s_->ending = true;
    s_->label = label;
    s_->changed.notify_all();
  }
  wait_over();
  if (s_->error) std::rethrow_exception(s_->error);
  return s_->report;
}

void FedUpdate::abort(const std::string& reason) noexcept {
  {
    const std::lock_guard lock(s_->mutex);
    if (!s_->over) s_->abort_reason = reason;
    s_->changed.notify_all();
  }
  wait_over();
}

}  // namespace ferry::receiver
