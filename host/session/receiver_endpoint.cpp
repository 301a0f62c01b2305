// A receiver's public address: the HTTP control API plus the session listener it advertises at
// GET /ferry/session (see session/receiver_endpoint.hpp).
#include "session/receiver_endpoint.hpp"

#include <sys/socket.h>
#include <unistd.h>
#include <ferry/sdk/error.hpp>

#include <cerrno>

#include <array>
#include <atomic>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/log.hpp"
#include "config/config.hpp"
#include "control/http_server.hpp"
#include "receiver/receiver.hpp"
#include "session/channel.hpp"
#include "session/receiver_session.hpp"
#include "session/served_ports.hpp"
#include "session/sharded_update.hpp"

namespace ferry::session {
namespace {

std::atomic<unsigned> g_endpoint_counter{0};

// How long a release waits for the senders of kept sessions to let go of the memory.
constexpr std::chrono::seconds kClosingTimeout{5};

// Session connections served at once, each on its own thread (kept sessions included); more are
// refused with a Refusal naming the limit. Connections that send no Hello end after the
// handshake deadline (ReceiverSessionSettings::hello_timeout), so idle ones free their place.
constexpr std::size_t kMaxSessionConnections = 256;
// A refused connection is half-closed and read until the sender closes it (at most this long),
// so that closing it cannot reset the connection before the sender read the Refusal.
constexpr std::chrono::milliseconds kRefusedDrain{1000};
constexpr std::size_t kMaxDraining = 64;

// A Unix socket path unique to this process and endpoint; empty when no folder fits.
std::string unix_socket_path() {
  const char* dir = std::getenv("XDG_RUNTIME_DIR");
  std::string base = (dir != nullptr && *dir != '\0') ? dir : "/tmp";
  std::string path =
      fmt::format("{}/ferry-session-{}-{}.sock", base, ::getpid(), g_endpoint_counter.fetch_add(1));
  if (path.size() >= 100)
    path =
        fmt::format("/tmp/ferry-session-{}-{}.sock", ::getpid(), g_endpoint_counter.fetch_add(1));
  return path;
}

}  // namespace

struct ReceiverEndpoint::Impl {
  receiver::Receiver& receiver;
  config::Config config;
  const registry::Registry& registry;
  ReceiverSessionSettings settings;
  std::unique_ptr<control::ControlServer> control;
  Listener tcp;
  Listener unix_socket;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  bool started = false;

  struct Connection {
    std::unique_ptr<Channel> channel;
    std::thread thread;
    std::atomic<bool> done{false};
    std::shared_ptr<SessionLink> link = std::make_shared<SessionLink>();
  };
  std::mutex connections_mutex;
  std::list<Connection> connections;
  // Refused connections being drained (accept thread only).
  std::vector<std::pair<int, Clock::time_point>> draining;
  Clock::time_point last_refusal_log{};
  std::size_t refused_since_log = 0;

  Impl(receiver::Receiver& r, const config::Config& c, const registry::Registry& reg)
      : receiver(r), config(c), registry(reg) {
    settings.token = config.receiver.token;
    settings.keep_sessions = config.update.keep_sessions;
    settings.bucket_timeout = std::chrono::milliseconds(config.update.bucket_timeout_ms);
    settings.commit_timeout = std::chrono::milliseconds(config.update.commit_timeout_ms);
    settings.hello_timeout = std::min(settings.bucket_timeout, std::chrono::milliseconds(10000));
    // Sharded updates: every rank's Hello within the handshake deadline of the first.
    settings.sharded =
        std::make_shared<ShardedUpdates>(receiver, settings.hello_timeout, settings.bucket_timeout);
  }

  void reap_finished_locked() {
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done.load()) {
        if (it->thread.joinable()) it->thread.join();
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(int fd, const std::string& peer) {
    std::lock_guard lock(connections_mutex);
    reap_finished_locked();
    if (connections.size() >= kMaxSessionConnections) return refuse(fd, peer);
    auto& c = connections.emplace_back();
    c.channel = std::make_unique<Channel>(fd, "sender " + peer);
    Connection* conn = &c;
    conn->thread = std::thread([this, conn] {
      serve_session(*conn->channel, receiver, registry, config, settings, *conn->link);
      conn->done.store(true);
    });
  }

  // The receiver's release hook: every kept session between updates is told (Closing). One
  // whose sender rejoins after a release (Hello.rejoinAfterRelease) is suspended: its sender
  // drops its data path, unmapping what it imported of this receiver's memory, and says so; the
  // session drops its own (its registrations of that memory) and stays, for the sender's Rejoin
  // after the resume. Any other closes: its sender drops the data path and disconnects, which
  // ends the session. Waits for that up to kClosingTimeout; a sender that does not answer is
  // disconnected (its mapping then lasts until it notices).
  void close_kept_sessions(const std::string& reason) {
    // Held throughout: no channel is reaped while it is written to or waited for.
    std::lock_guard lock(connections_mutex);
    std::vector<Connection*> suspending, closing;
    std::size_t left = 0;  // kept sessions that read in place: they share nothing
    for (auto& c : connections) {
      if (c.link->shares_nothing()) {
        ++left;
        continue;
      }
      const bool suspend = c.link->start_suspending();
      if (!suspend && !c.link->start_closing()) continue;
      (suspend ? suspending : closing).push_back(&c);
      try {
        capnp::MallocMessageBuilder m;
        auto msg = m.initRoot<wire::Message>().initClosing();
        msg.setReason(reason);
        msg.setSuspend(suspend);
        c.channel->send(m, deadline_in(std::chrono::milliseconds(1000)), "closing");
      } catch (const Error& e) {
        logger("session")->debug("{}: closing: {}", c.channel->peer(), e.what());
        c.channel->shutdown();
      }
    }
    const auto start = Clock::now();
    const auto deadline = start + kClosingTimeout;
    const auto give_up = [&](Connection* c, const char* what) {
      logger("session")->warn(
          "{} did not {} its kept session within {} s of being told ({}); disconnected. "
          "Memory it imported stays allocated until it notices",
          c->channel->peer(), what, kClosingTimeout.count(), reason);
      c->channel->shutdown();
      c->link->wait_ended(Clock::now() + kClosingTimeout);
    };
    for (auto* c : suspending) {
      if (!c->link->wait_suspended(deadline)) give_up(c, "suspend");
    }
    for (auto* c : closing) {
      if (!c->link->wait_ended(deadline)) give_up(c, "close");
    }
    if (!suspending.empty() || !closing.empty()) {
      logger("session")->info(
          "{} kept session(s) suspended and {} closed in {:.3f} ms ({})", suspending.size(),
          closing.size(), std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
          reason);
    }
    if (left > 0) {
      logger("session")->info(
          "{} kept session(s) left as they are ({}): they read their senders' tensors in place "
          "and share none of this receiver's memory",
          left, reason);
    }
  }

  // The receiver's resume hook: every suspended kept session whose sender takes the word is told
  // its memory is back (Message.resumed); the sender rejoins at once (its Rejoin then waits for
  // the update lock this hook's caller holds). Nothing is waited for: a sender that does not
  // rejoin now does at its next push.
  void tell_resumed() {
    std::lock_guard lock(connections_mutex);
    std::size_t told = 0;
    for (auto& c : connections) {
      try {
        told += c.link->tell_resumed([&] {
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Message>().setResumed();
          c.channel->send(m, deadline_in(std::chrono::milliseconds(1000)), "resumed");
        });
      } catch (const Error& e) {
        // Half a frame may have gone: the session ends (its sender opens a new one).
        logger("session")->info("{}: resumed not sent ({}); session closed", c.channel->peer(),
                                e.what());
        c.channel->shutdown();
      }
    }
    if (told > 0) {
      logger("session")->info("{} suspended kept session(s) told the memory is back", told);
    }
  }

  // Answers a connection over the limit with a Refusal (the sender reports it) and drains it.
  void refuse(int fd, const std::string& peer) {
    Channel channel(fd, "sender " + peer);
    const std::string why = fmt::format(
        "this receiver has {} session connections open, its limit; try again when one ends",
        kMaxSessionConnections);
    // One line per burst, not per connection: a flood of connections would flood the log.
    ++refused_since_log;
    if (Clock::now() - last_refusal_log >= std::chrono::seconds(10)) {
      logger("session")->warn("{} session connection(s) refused (the last from {}): {}",
                              refused_since_log, peer, why);
      last_refusal_log = Clock::now();
      refused_since_log = 0;
    }
    try {
      capnp::MallocMessageBuilder m;
      auto refusal = m.initRoot<wire::Message>().initRefusal();
      refusal.setCode(static_cast<std::uint32_t>(FERRY_STATUS_FAILED_PRECONDITION));
      refusal.setMessage(why);
      channel.send(m, deadline_in(std::chrono::milliseconds(100)), "refusal");
    } catch (const Error& e) {
      logger("session")->debug("sender {}: refusal not sent: {}", peer, e.what());
      return;
    }
    if (draining.size() >= kMaxDraining) return;
    const int kept = ::dup(channel.fd());
    if (kept < 0) return;
    ::shutdown(kept, SHUT_WR);
    draining.emplace_back(kept, Clock::now() + kRefusedDrain);
  }

  // Reads and discards what refused senders still send; closes each at its end or deadline.
  void drain_refused() {
    for (auto it = draining.begin(); it != draining.end();) {
      char discard[4096];
      ssize_t n = 0;
      while ((n = ::recv(it->first, discard, sizeof discard, MSG_DONTWAIT)) > 0) {
      }
      const bool open = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      if (!open || Clock::now() >= it->second) {
        ::close(it->first);
        it = draining.erase(it);
      } else {
        ++it;
      }
    }
  }

  void accept_loop() {
    const std::array<const Listener*, 2> listeners = {&tcp, &unix_socket};
    while (!stopping.load()) {
      std::string peer;
      // The timeout only bounds how late a stop is noticed.
      const int fd = accept_connection(listeners, std::chrono::milliseconds(100), peer);
      if (fd >= 0 && !stopping.load()) serve(fd, peer);
      if (fd >= 0 && stopping.load()) ::close(fd);
      drain_refused();
      if (fd < 0) {
        // Finished sessions are joined within one poll timeout, not only when the next sender
        // connects: a finished, unjoined thread keeps its stack mapped.
        std::lock_guard lock(connections_mutex);
        reap_finished_locked();
      }
    }
  }

  std::string session_info() const {
    nlohmann::json info{{"protocol", wire::PROTOCOL_VERSION},
                        {"port", tcp.port},
                        {"unix_path", unix_socket.unix_path}};
    return info.dump();
  }
};

ReceiverEndpoint::ReceiverEndpoint(receiver::Receiver& receiver, const config::Config& config,
                                   const registry::Registry& registry)
    : impl_(std::make_unique<Impl>(receiver, config, registry)) {}

ReceiverEndpoint::~ReceiverEndpoint() {
  stop();
}

void ReceiverEndpoint::start() {
  auto& i = *impl_;
  if (i.started) return;
  i.tcp = listen_tcp(i.config.receiver.host, 0);
  try {
    i.unix_socket = listen_unix(unix_socket_path());
  } catch (const Error& e) {
    logger("session")->warn("no Unix session socket ({}); TCP only", e.what());
  }
  control::ServerOptions options{i.config.receiver.host, i.config.receiver.port,
                                 i.config.receiver.token};
  options.session_info = [impl = impl_.get()] { return impl->session_info(); };
  i.control = std::make_unique<control::ControlServer>(i.receiver, options);
  try {
    i.control->start();
  } catch (...) {
    i.tcp.close();
    i.unix_socket.close();
    throw;
  }
  i.settings.name = fmt::format("{}:{}", i.config.receiver.host, i.control->port());
  i.stopping = false;
  i.accept_thread = std::thread([impl = impl_.get()] { impl->accept_loop(); });
  i.receiver.set_release_hook(
      [impl = impl_.get()](const std::string& reason) { impl->close_kept_sessions(reason); });
  i.receiver.set_resume_hook([impl = impl_.get()] { impl->tell_resumed(); });
  i.started = true;
  note_served_port(i.control->port());
  logger("session")->info("sessions on {}:{}{}", i.config.receiver.host, i.tcp.port,
                          i.unix_socket.unix_path.empty() ? "" : " and " + i.unix_socket.unix_path);
}

void ReceiverEndpoint::stop() {
  if (!impl_) return;
  auto& i = *impl_;
  if (!i.started) return;
  i.receiver.set_release_hook({});
  i.receiver.set_resume_hook({});
  if (i.control) forget_served_port(i.control->port());
  i.stopping = true;
  if (i.accept_thread.joinable()) i.accept_thread.join();
  for (const auto& [fd, deadline] : i.draining) ::close(fd);
  i.draining.clear();
  {
    std::lock_guard lock(i.connections_mutex);
    for (auto& c : i.connections) c.channel->shutdown();
    for (auto& c : i.connections) {
      if (c.thread.joinable()) c.thread.join();
    }
    i.connections.clear();
  }
  i.tcp.close();
  i.unix_socket.close();
  if (i.control) i.control->stop();
  i.started = false;
}

int ReceiverEndpoint::port() const {
  return impl_->control ? impl_->control->port() : -1;
}

}  // namespace ferry::session
