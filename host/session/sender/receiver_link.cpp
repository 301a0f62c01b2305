// A sender's session with one receiver and the watcher of a kept one (see
// session/sender/receiver_link.hpp).
#include "session/sender/receiver_link.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

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

void Link::read_needs(capnp::List<wire::Need>::Reader given, std::span<const TensorView> declared,
                      const std::string& peer) {
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
    Piece p;
    p.none = given[i].getNone();
    for (auto v : given[i].getOffsets()) p.offsets.push_back(v);
    for (auto v : given[i].getExtents()) p.extents.push_back(v);
    bool whole = true;
    if (!t.replica && !p.none) {
      std::string bad;
      if (p.offsets.size() != t.shape.size() || p.extents.size() != t.shape.size()) {
        bad = fmt::format("{} dims for a block of {}", p.extents.size(), t.shape.size());
      }
      for (std::size_t d = 0; bad.empty() && d < t.shape.size(); ++d) {
        const std::uint64_t at = t.offsets.empty() ? 0 : t.offsets[d];
        const std::uint64_t first = p.offsets[d], n = p.extents[d];
        if (first < at || n == 0 || n > t.shape[d] || first - at > t.shape[d] - n) {
          bad = fmt::format("dim {}: [{}, {}) of the block's [{}, {})", d, first, first + n, at,
                            at + t.shape[d]);
        } else if ((first != at || n != t.shape[d]) && (d > 1 || (d == 1 && t.shape.size() != 2))) {
          bad = fmt::format("narrowed on dim {} of {}", d, t.shape.size());
        }
        whole = whole && first == at && n == t.shape[d];
      }
      if (!bad.empty()) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: welcome: tensor '{}': a need that does not fit its block ({})", peer, t.name,
             bad);
      }
    }
    trims = trims || (!t.replica && (p.none || !whole));
    needs.push_back(std::move(p));
  }
}

std::size_t Link::sent_count(std::span<const TensorView> declared) const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < declared.size(); ++i) {
    if (!declared[i].replica && !(i < needs.size() && needs[i].none)) ++n;
  }
  return n;
}

std::vector<TensorView> Link::sent_views(std::span<const TensorView> declared) {
  // Pieces narrowed on dim 1 are copied out, 256-byte aligned, host and device apart.
  constexpr std::uint64_t kAlign = 256;
  const auto narrowed = [&](std::size_t i) {
    const TensorView& t = declared[i];
    return i < needs.size() && !needs[i].none && t.shape.size() == 2 &&
           needs[i].extents[1] != t.shape[1];
  };
  std::uint64_t host_bytes = 0, device_bytes = 0;
  int device = -1;
  for (std::size_t i = 0; i < declared.size(); ++i) {
    if (declared[i].replica || !narrowed(i)) continue;
    const TensorView& t = declared[i];
    const std::uint64_t bytes =
        (needs[i].extents[0] * needs[i].extents[1] * dtype_size(t.dtype) + kAlign - 1) / kAlign *
        kAlign;
    if (t.memory_kind == FERRY_MEMORY_CUDA) {
      if (device >= 0 && t.device != device) {
        fail(FERRY_STATUS_UNIMPLEMENTED,
             "push: tensor '{}': a receiver needs columns of blocks on CUDA devices {} and {}; "
             "one device per sender rank",
             t.name, device, t.device);
      }
      device = t.device;
      device_bytes += bytes;
    } else {
      host_bytes += bytes;
    }
  }
  if (host_bytes + device_bytes > 0) gathered.reserve(host_bytes, device_bytes, device);
  std::uint64_t host_at = 0, device_at = 0;
  std::vector<TensorView> out;
  out.reserve(declared.size());
  for (std::size_t i = 0; i < declared.size(); ++i) {
    const TensorView& t = declared[i];
    if (t.replica) continue;
    if (i >= needs.size() || t.shape.empty()) {
      if (i >= needs.size() || !needs[i].none) out.push_back(t);
      continue;
    }
    const Piece& p = needs[i];
    if (p.none) continue;
    TensorView v = t;
    if (v.global_shape.empty()) v.global_shape = t.shape;
    if (v.offsets.empty()) v.offsets.assign(t.shape.size(), 0);
    const std::uint64_t row0 = p.offsets[0] - v.offsets[0];
    if (narrowed(i)) {
      const std::uint64_t col0 = p.offsets[1] - v.offsets[1];
      const bool cuda = t.memory_kind == FERRY_MEMORY_CUDA;
      std::uint64_t& at = cuda ? device_at : host_at;
      std::byte* dst = (cuda ? gathered.device() : gathered.host()) + at;
      gathered.gather(dst, t, row0, p.extents[0], col0, p.extents[1]);
      at += (p.extents[0] * p.extents[1] * dtype_size(t.dtype) + kAlign - 1) / kAlign * kAlign;
      v.data = dst;
      if (!cuda) v.memory_kind = FERRY_MEMORY_HOST;
    } else {
      // A block is row-major: its rows [row0, row0 + rows) are contiguous.
      std::uint64_t row_bytes = dtype_size(t.dtype);
      for (std::size_t d = 1; d < t.shape.size(); ++d) row_bytes *= t.shape[d];
      v.data = static_cast<const std::byte*>(t.data) + row0 * row_bytes;
    }
    v.shape = p.extents;
    v.offsets = p.offsets;
    out.push_back(std::move(v));
  }
  gathered.wait();
  return out;
}

bool Link::start_watching(const std::string& peer, std::function<void(Link&)> rejoin) {
  rejoin_ = std::move(rejoin);
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
    // The receiver spoke between pushes: its Closing (to suspend or to end the session), its
    // word that the memory of a suspended session is back, or its disconnect.
    closed_why = "the receiver disconnected";
    try {
      auto msg = channel->recv(deadline_in(std::chrono::milliseconds(1000)), "between pushes");
      if (msg->root().which() == wire::Message::RESUMED) {
        closed_why.clear();
        if (!suspended || !rejoin_) continue;  // nothing to rejoin: the next push decides
        try {
          rejoin_(*this);
        } catch (const Error& e) {
          closed_why = fmt::format("its rejoin after the receiver's resume failed: {}", e.what());
          break;
        } catch (...) {
          closed_why = "its rejoin after the receiver's resume failed";
          break;
        }
        continue;
      }
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
          logger("sender")->debug(
              "{}: kept session suspended ({}); data path dropped in "
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
