// A sender's session with one receiver and the watcher of a kept one (see
// session/sender/receiver_link.hpp).
#include "session/sender/receiver_link.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "common/log.hpp"

namespace ferry::session {

Link::~Link() {
  stop_watching();
  data.reset();  // first: the receiver takes the disconnect as the sign it is done
  channel.reset();
}

void Link::remember(std::span<const TensorView> tensors, const PushPlan& plan) {
  catalog_.clear();
  catalog_.reserve(tensors.size());
  for (const auto& t : tensors) catalog_.push_back({t.name, t.dtype, t.shape});
  capacity_ = plan.capacity;
  device_ = plan.device;
  cuda_tensors_ = plan.cuda_tensors;
}

bool Link::fits(std::span<const TensorView> tensors, const PushPlan& plan,
                std::optional<bool> catalog_same) const {
  return plan.capacity <= capacity_ && plan.device == device_ &&
         plan.cuda_tensors == cuda_tensors_ &&
         (catalog_same ? *catalog_same : same_catalog(tensors));  // (value_or would compare)
}

bool Link::same_catalog(std::span<const TensorView> tensors) const {
  if (tensors.size() != catalog_.size()) return false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const auto& c = catalog_[i];
    if (t.dtype != c.dtype || t.name != c.name || t.shape != c.shape) return false;
  }
  return true;
}

Link::Held Link::held_of(const TensorView& t) {
  return {{t.name, t.dtype, t.shape}, t.global_shape, t.offsets, t.replica};
}

void Link::remember_shard(const ShardSpec& shard, std::span<const TensorView> declared) {
  shard_ = shard;
  held_.clear();
  if (shard.world == 0) return;
  held_.reserve(declared.size());
  for (const auto& t : declared) held_.push_back(held_of(t));
}

bool Link::same_shard(const ShardSpec& shard, std::span<const TensorView> declared) const {
  if (shard.world != shard_.world || shard.rank != shard_.rank) return false;
  if (shard.world == 0) return true;
  if (declared.size() != held_.size()) return false;
  for (std::size_t i = 0; i < declared.size(); ++i) {
    if (!(held_of(declared[i]) == held_[i])) return false;
  }
  return true;
}

bool Link::start_watching(const std::string& peer) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return false;
  try {
    watcher_ = std::thread([this, peer] { watch(peer); });
  } catch (const std::system_error&) {
    ::close(wake_fd_);
    wake_fd_ = -1;
    return false;
  }
  return true;
}

void Link::ask_to_stop() noexcept {
  if (!watcher_.joinable() || stop_asked_) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
  stop_asked_ = true;
}

void Link::stop_watching() noexcept {
  if (watcher_.joinable()) {
    ask_to_stop();
    watcher_.join();
  }
  stop_asked_ = false;
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

void Link::watch(const std::string& peer) {
  pollfd fds[2] = {{channel->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    while (true) {
      const int n = ::poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || fds[1].revents != 0) return;  // taken back (or no way to wait)
      if (fds[0].revents != 0) break;
    }
    // The receiver spoke between pushes: its Closing (to suspend or to end the session), or its
    // disconnect.
    closed_why = "the receiver disconnected";
    try {
      auto msg = channel->recv(deadline_in(std::chrono::milliseconds(1000)), "between pushes");
      if (msg->root().which() == wire::Message::CLOSING) {
        const auto closing = msg->root().getClosing();
        closed_why = fmt::format("the receiver closed it: {}", text(closing.getReason()));
        if (closing.getSuspend() && !suspended) {
          // The receiver releases its memory and keeps the session: unmap it, say so.
          const auto start = Clock::now();
          data.reset();
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Message>().setPathDropped();
          channel->send(m, deadline_in(std::chrono::milliseconds(1000)), "path dropped");
          suspended = true;
          logger("sender")->debug("{}: kept session suspended ({}); data path dropped in "
                                  "{:.3f} ms",
                                  peer, text(closing.getReason()), seconds_since(start) * 1e3);
          closed_why.clear();
          continue;
        }
      } else {
        closed_why = "the receiver sent an unexpected message between pushes";
      }
    } catch (const std::exception& e) {
      closed_why = e.what();
    }
    break;
  }
  const auto start = Clock::now();
  data.reset();
  channel.reset();
  closed = true;
  logger("sender")->info("{}: kept session ended ({}); dropped in {:.3f} ms", peer, closed_why,
                         seconds_since(start) * 1e3);
}

}  // namespace ferry::session
