// cuda_ipc/ipc_link.cpp: the Unix-socket control plane of the CUDA IPC transport: listener and
// service thread, peer links, mailboxes and dead-peer detection (see ipc_link.hpp).
#include "ipc_link.hpp"

#include <ferry/sdk/error.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>

namespace ferry::cuda_ipc {
namespace {

constexpr std::int64_t kHelloWaitNs = 5'000'000'000;

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "cuda_ipc: socket path '{}' is longer than {} bytes (choose a shorter socket_dir)", path,
         sizeof a.sun_path - 1);
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

// Waits on `cv` until `ready()` or deadline_ns (CLOCK_MONOTONIC); false on timeout.
template <typename Ready>
bool wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                std::int64_t deadline_ns, Ready ready) {
  while (!ready()) {
    const std::int64_t left = deadline_ns - monotonic_ns();
    if (left <= 0) return false;
    cv.wait_for(lock, std::chrono::nanoseconds(std::min<std::int64_t>(left, 100'000'000)));
  }
  return true;
}

}  // namespace

// ---- PeerLink --------------------------------------------------------------------------------

PeerLink::PeerLink(Endpoint& endpoint, UniqueFd socket, Address remote, std::string name,
                   std::shared_ptr<Mailbox> box)
    : endpoint_(endpoint),
      socket_(std::move(socket)),
      remote_(std::move(remote)),
      name_(std::move(name)),
      box_(std::move(box)) {}

PeerLink::~PeerLink() {
  const Nonce peer = remote_.nonce;
  socket_.reset();
  box_.reset();
  endpoint_.forget_if_unused(peer);
}

void PeerLink::send(const Frame& frame) {
  std::lock_guard lock(socket_mutex_);
  if (!broken_.empty()) fail(FERRY_STATUS_PEER_FAILED, "{}", broken_);
  try {
    send_frame(socket_.get(), frame, name_);
  } catch (const Error& e) {
    broken_ = e.what();
    throw;
  }
}

Frame PeerLink::import(Nonce owner, std::uint64_t memory_id, std::int64_t deadline_ns) {
  check_alive();
  std::lock_guard lock(socket_mutex_);
  if (!broken_.empty()) fail(FERRY_STATUS_PEER_FAILED, "{}", broken_);
  Frame reply;
  try {
    send_frame(socket_.get(),
               Frame{MessageType::ImportRequest, PayloadWriter().u64(owner).u64(memory_id).take(),
                     {}},
               name_);
    reply = recv_frame(socket_.get(), deadline_ns, name_);
  } catch (const Error& e) {
    // A timeout leaves a reply in flight that would answer the next request: the link is no
    // longer usable either way.
    broken_ = e.what();
    throw;
  }
  auto close_fds = [&] {
    for (int fd : reply.fds) ::close(fd);
    reply.fds.clear();
  };
  if (reply.type != MessageType::ImportReply) {
    close_fds();
    broken_ = fmt::format("cuda_ipc: {} answered an import with message type {}", name_,
                          static_cast<int>(reply.type));
    fail(FERRY_STATUS_CORRUPT_DATA, "{}", broken_);
  }
  PayloadReader r(reply.payload, "import reply");
  const auto status = static_cast<ferry_status_code_t>(r.u32());
  if (status != FERRY_STATUS_OK) {
    close_fds();
    const std::string message = r.str();
    fail(status, "{} refused to share memory {}: {}", name_, memory_id, message);
  }
  reply.payload.erase(reply.payload.begin(), reply.payload.begin() + 4);
  return reply;
}

void PeerLink::check_locked() {
  if (!box_->aborted.empty()) fail(FERRY_STATUS_ABORTED, "cuda_ipc: aborted: {}", box_->aborted);
  if (!box_->dead.empty()) fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc: {}: {}", name_, box_->dead);
}

void PeerLink::check_alive() {
  {
    std::lock_guard lock(socket_mutex_);
    if (!broken_.empty()) fail(FERRY_STATUS_PEER_FAILED, "{}", broken_);
  }
  std::lock_guard lock(box_->mutex);
  check_locked();
}

bool PeerLink::revoked(std::uint64_t memory_id) {
  std::lock_guard lock(box_->mutex);
  return box_->revoked.count(memory_id) > 0;
}

std::vector<std::uint64_t> PeerLink::take_newly_revoked() {
  std::lock_guard lock(box_->mutex);
  return std::exchange(box_->newly_revoked, {});
}

std::optional<BucketReady> PeerLink::take_ready(std::uint32_t index) {
  std::lock_guard lock(box_->mutex);
  if (auto it = box_->ready.find(index); it != box_->ready.end()) {
    BucketReady r = it->second;
    box_->ready.erase(it);
    return r;
  }
  check_locked();
  return std::nullopt;
}

BucketReady PeerLink::wait_ready(std::uint32_t index, std::int64_t deadline_ns) {
  std::unique_lock lock(box_->mutex);
  const bool arrived = wait_until(lock, box_->changed, deadline_ns, [&] {
    return box_->ready.count(index) > 0 || !box_->dead.empty() || !box_->aborted.empty();
  });
  if (auto it = box_->ready.find(index); it != box_->ready.end()) {
    BucketReady r = it->second;
    box_->ready.erase(it);
    return r;
  }
  check_locked();
  if (!arrived) {
    fail(FERRY_STATUS_TIMEOUT, "cuda_ipc: deadline passed waiting for {} to announce bucket {}",
         name_, index);
  }
  fail(FERRY_STATUS_INTERNAL, "cuda_ipc: wait for bucket {} ended without a reason", index);
}

bool PeerLink::take_released(std::uint32_t index) {
  std::lock_guard lock(box_->mutex);
  if (auto it = box_->released.find(index); it != box_->released.end()) {
    box_->released.erase(it);
    return true;
  }
  check_locked();
  return false;
}

void PeerLink::wait_released(std::uint32_t index, std::int64_t deadline_ns) {
  std::unique_lock lock(box_->mutex);
  const bool arrived = wait_until(lock, box_->changed, deadline_ns, [&] {
    return box_->released.count(index) > 0 || !box_->dead.empty() || !box_->aborted.empty();
  });
  if (auto it = box_->released.find(index); it != box_->released.end()) {
    box_->released.erase(it);
    return;
  }
  check_locked();
  if (!arrived) {
    fail(FERRY_STATUS_TIMEOUT,
         "cuda_ipc: deadline passed waiting for {} to release staged bucket {}", name_, index);
  }
}

// ---- Endpoint --------------------------------------------------------------------------------

Endpoint::Endpoint(const std::string& socket_dir, Nonce nonce, ImportHandler handler)
    : nonce_(nonce), handler_(std::move(handler)) {
  address_.nonce = nonce;
  address_.pid = static_cast<std::uint32_t>(::getpid());
  address_.host = local_host();
  address_.boot_id = local_boot_id();
  address_.socket_path =
      fmt::format("{}/ferry-cuda-ipc-{}-{:016x}.sock", socket_dir, ::getpid(), nonce);
  const sockaddr_un a = unix_address(address_.socket_path);
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_) fail(FERRY_STATUS_IO, "cuda_ipc: socket(): {}", std::strerror(errno));
  ::unlink(address_.socket_path.c_str());
  if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    fail(FERRY_STATUS_IO, "cuda_ipc: cannot bind socket '{}': {}", address_.socket_path,
         std::strerror(errno));
  }
  ::chmod(address_.socket_path.c_str(), 0600);  // same user only
  if (::listen(listener_.get(), 64) != 0) {
    const int err = errno;
    ::unlink(address_.socket_path.c_str());
    fail(FERRY_STATUS_IO, "cuda_ipc: listen on '{}': {}", address_.socket_path,
         std::strerror(err));
  }
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) {
    ::unlink(address_.socket_path.c_str());
    fail(FERRY_STATUS_IO, "cuda_ipc: eventfd(): {}", std::strerror(errno));
  }
  thread_ = std::thread([this] { serve(); });
}

Endpoint::~Endpoint() {
  const std::uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full after one write; nothing else can fail here.
  }
  if (thread_.joinable()) thread_.join();
  ::unlink(address_.socket_path.c_str());
}

std::shared_ptr<Mailbox> Endpoint::mailbox(Nonce peer) {
  std::lock_guard lock(mutex_);
  auto& box = boxes_[peer];
  if (!box) {
    box = std::make_shared<Mailbox>();
    box->aborted = aborted_;
  }
  return box;
}

void Endpoint::forget_if_unused(Nonce peer) {
  std::lock_guard lock(mutex_);
  auto it = boxes_.find(peer);
  if (it != boxes_.end() && it->second.use_count() == 1) boxes_.erase(it);
}

void Endpoint::abort(const std::string& reason) {
  std::lock_guard lock(mutex_);
  aborted_ = reason.empty() ? "abort requested" : reason;
  for (auto& [nonce, box] : boxes_) {
    std::lock_guard box_lock(box->mutex);
    box->aborted = aborted_;
    box->changed.notify_all();
  }
}

std::size_t Endpoint::incoming_count() {
  std::lock_guard lock(mutex_);
  return incoming_count_;
}

std::unique_ptr<PeerLink> Endpoint::connect(const Address& remote, const std::string& peer_name,
                                            std::int64_t deadline_ns) {
  if (remote.boot_id != address_.boot_id || remote.host != address_.host) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "cuda_ipc is same-node only: {} is on host '{}' (boot {}), this process on '{}' "
         "(boot {})",
         peer_name, remote.host, remote.boot_id, address_.host, address_.boot_id);
  }
  const sockaddr_un a = unix_address(remote.socket_path);
  UniqueFd socket;
  for (;;) {
    socket.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!socket) fail(FERRY_STATUS_IO, "cuda_ipc: socket(): {}", std::strerror(errno));
    if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) break;
    const int err = errno;
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      fail(FERRY_STATUS_PEER_FAILED, "cuda_ipc: cannot connect to {} at '{}': {}", peer_name,
           remote.socket_path, std::strerror(err));
    }
    if (monotonic_ns() >= deadline_ns) {
      fail(FERRY_STATUS_TIMEOUT,
           "cuda_ipc: deadline passed connecting to {} at '{}' ({}: is the peer alive?)",
           peer_name, remote.socket_path, std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  send_frame(socket.get(), Frame{MessageType::Hello, PayloadWriter().u64(nonce_).take(), {}},
             peer_name);
  return std::make_unique<PeerLink>(*this, std::move(socket), remote, peer_name,
                                    mailbox(remote.nonce));
}

bool Endpoint::handle(Incoming& in) {
  Frame frame;
  try {
    frame = recv_frame(in.socket.get(), monotonic_ns() + kHelloWaitNs, "an incoming peer");
  } catch (const Error&) {
    return false;  // closed, broken or silent: the peer is gone
  }
  for (int fd : frame.fds) ::close(fd);  // peers never send us handles unasked
  try {
    PayloadReader r(frame.payload, "control message");
    if (in.nonce == 0) {
      if (frame.type != MessageType::Hello) return false;
      in.nonce = r.u64();
      in.box = mailbox(in.nonce);
      std::lock_guard lock(in.box->mutex);
      in.box->incoming_open = true;
      return true;
    }
    switch (frame.type) {
      case MessageType::ImportRequest: {
        const Nonce owner = r.u64();
        const std::uint64_t memory_id = r.u64();
        Frame reply{MessageType::ImportReply, {}, {}};
        std::vector<UniqueFd> fds;
        try {
          check_key_owner(Key{owner, memory_id, 0, 0, ShareKind::Vmm}, nonce_,
                          "this receiver");
          ImportAnswer answer = handler_(memory_id);
          reply.payload = PayloadWriter().u32(FERRY_STATUS_OK).take();
          reply.payload.insert(reply.payload.end(), answer.body.begin(), answer.body.end());
          fds = std::move(answer.fds);
          for (auto& fd : fds) reply.fds.push_back(fd.get());
        } catch (const Error& e) {
          reply.payload = PayloadWriter().u32(e.code()).str(e.what()).take();
        }
        send_frame(in.socket.get(), reply, "an importing peer");
        return true;  // fds close here, after the kernel duplicated them into the message
      }
      case MessageType::BucketReady: {
        BucketReady b;
        b.index = r.u32();
        b.memory_id = r.u64();
        b.offset = r.u64();
        b.size = r.u64();
        std::lock_guard lock(in.box->mutex);
        in.box->ready[b.index] = b;
        in.box->changed.notify_all();
        return true;
      }
      case MessageType::BucketReleased: {
        const std::uint32_t index = r.u32();
        std::lock_guard lock(in.box->mutex);
        in.box->released.insert(index);
        in.box->changed.notify_all();
        return true;
      }
      case MessageType::Revoked: {
        const std::uint64_t memory_id = r.u64();
        std::lock_guard lock(in.box->mutex);
        if (in.box->revoked.insert(memory_id).second) in.box->newly_revoked.push_back(memory_id);
        return true;
      }
      default:
        return false;
    }
  } catch (const Error&) {
    return false;  // malformed: drop the connection; waits on it then fail naming the peer
  }
}

void Endpoint::serve() {
  std::list<Incoming> incoming;
  auto close_incoming = [&](std::list<Incoming>::iterator it) {
    if (it->box) {
      std::lock_guard lock(it->box->mutex);
      it->box->incoming_open = false;
      it->box->dead = "the peer closed its connection (process exited or transport destroyed)";
      it->box->changed.notify_all();
    }
    const Nonce peer = it->nonce;
    it->box.reset();
    incoming.erase(it);
    if (peer != 0) forget_if_unused(peer);
    std::lock_guard lock(mutex_);
    incoming_count_ = incoming.size();
  };
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({listener_.get(), POLLIN, 0});
    for (auto& in : incoming) fds.push_back({in.socket.get(), POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;
    if ((fds[1].revents & POLLIN) != 0) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        incoming.push_back(Incoming{UniqueFd(fd), 0, nullptr});
        std::lock_guard lock(mutex_);
        incoming_count_ = incoming.size();
      }
    }
    std::size_t i = 2;
    for (auto it = incoming.begin(); it != incoming.end(); ++i) {
      if (i >= fds.size() || fds[i].revents == 0) {
        ++it;
        continue;
      }
      auto next = std::next(it);
      if (!handle(*it)) close_incoming(it);
      it = next;
    }
  }
  while (!incoming.empty()) close_incoming(incoming.begin());
}

}  // namespace ferry::cuda_ipc
