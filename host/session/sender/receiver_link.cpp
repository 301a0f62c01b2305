// A sender's session with one receiver and the watcher of a kept one (see
// session/sender/receiver_link.hpp).
#include "session/sender/receiver_link.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
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

void Link::read_needs(capnp::List<wire::Need>::Reader given,
                      std::span<const TensorView> declared, const std::string& peer) {
  needs.clear();
  trims = false;
  if (given.size() == 0) return;
  if (given.size() != declared.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: welcome: {} needs for {} blocks", peer, given.size(),
         declared.size());
  }
  needs.reserve(declared.size());
  for (unsigned i = 0; i < given.size(); ++i) {
    const TensorView& t = declared[i];
    const std::uint64_t first = given[i].getFirstRow();
    const std::uint64_t rows = given[i].getRows();
    const std::uint64_t at = t.shape.empty() || t.offsets.empty() ? 0 : t.offsets[0];
    const std::uint64_t extent = t.shape.empty() ? 1 : t.shape[0];
    if (!t.replica && (first < at || rows > extent || first - at > extent - rows)) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: welcome: tensor '{}': rows [{}, {}) needed of a block of rows [{}, {})", peer,
           t.name, first, first + rows, at, at + extent);
    }
    needs.emplace_back(first, rows);
    trims = trims || (!t.replica && (first != at || rows != extent));
  }
}

std::vector<TensorView> Link::sent_views(std::span<const TensorView> declared) const {
  std::vector<TensorView> out;
  out.reserve(declared.size());
  for (std::size_t i = 0; i < declared.size(); ++i) {
    const TensorView& t = declared[i];
    if (t.replica) continue;
    const auto [first, rows] = i < needs.size() ? needs[i] : std::pair<std::uint64_t,
                                                                       std::uint64_t>{0, 1};
    if (i >= needs.size() || t.shape.empty()) {
      if (i >= needs.size() || rows > 0) out.push_back(t);
      continue;
    }
    if (rows == 0) continue;
    // A block is row-major: its rows [first - at, first - at + rows) are contiguous.
    std::uint64_t row_bytes = dtype_size(t.dtype);
    for (std::size_t d = 1; d < t.shape.size(); ++d) row_bytes *= t.shape[d];
    const std::uint64_t at = t.offsets.empty() ? 0 : t.offsets[0];
    TensorView v = t;
    v.data = static_cast<const std::byte*>(t.data) + (first - at) * row_bytes;
    v.shape[0] = rows;
    if (v.global_shape.empty()) v.global_shape = t.shape;
    if (v.offsets.empty()) v.offsets.assign(t.shape.size(), 0);
    v.offsets[0] = first;
    out.push_back(std::move(v));
  }
  return out;
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
