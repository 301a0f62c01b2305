// The event-driven HTTP/1.1 server under the control API (see control/http_listener.hpp): one
// connection object per socket, driven by completion handlers on the single I/O thread.
#include "control/http_listener.hpp"

#include <sys/resource.h>
#include <ferry/sdk/error.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/log.hpp"

namespace ferry::control {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

// How long a connection whose request body was not read (an answer before the body, a limit
// passed) is drained before it closes: closing with unread bytes would reset the connection,
// and the client could lose the answer.
constexpr std::chrono::milliseconds kDrainTime{2000};
constexpr std::size_t kDrainBuffer = 16u << 10;
// Connections past max_connections that are still answered 503 (beyond: closed unanswered).
constexpr std::size_t kMaxRefusing = 256;
// File descriptors kept for everything but connections (plugins, sessions, files, logs).
constexpr std::size_t kReservedFiles = 256;

bool is_disconnect(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::operation_aborted ||
         ec == net::error::bad_descriptor || ec == net::error::broken_pipe ||
         ec == http::error::partial_message;
}

class Connection;

// Everything the connections share (HttpListener::Impl is this).
struct Server {
  HttpLimits limits;
  HttpListener::Router router;
  HttpListener::ErrorAnswer error_answer;

  // Declared before the io_context: connections that its destruction releases still find them.
  std::mutex live_mutex;
  std::condition_variable live_changed;
  std::size_t live = 0;  // connection objects in existence (under live_mutex)
  // I/O thread only.
  std::unordered_set<Connection*> open;
  std::size_t refusing = 0;
  std::size_t queued[2] = {0, 0};  // per pool: requests running or waiting for a worker
  bool stopping = false;
  bool accept_failing = false;
  std::chrono::steady_clock::time_point last_refusal_log{};
  std::size_t refused_since_log = 0;

  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry_timer{ioc};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::unique_ptr<net::thread_pool> workers[2];  // Dispatch::Thread::reads, ::changes
  std::thread io_thread;
  bool started = false;
  bool stopped = false;

  Server(HttpLimits l, HttpListener::Router r, HttpListener::ErrorAnswer e)
      : limits(l), router(std::move(r)), error_answer(std::move(e)) {}

  void accept();
  void note_refusal();
  void run_io() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        // Handlers catch what they call; this is a bug, and the server goes on.
        logger("control")->error("HTTP I/O thread: {}", e.what());
      }
    }
  }
};

// One accepted socket: reads a request's head, asks the router, reads the body (or not), runs
// the handler (here or on a worker), writes the answer, and waits for the next request. Every
// member function runs on the I/O thread except the handler call in run().
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& server, tcp::socket socket, bool refuse)
      : server_(server), stream_(std::move(socket)), refuse_(refuse) {
    server_.open.insert(this);
    if (refuse_) ++server_.refusing;
    std::lock_guard lock(server_.live_mutex);
    ++server_.live;
  }
  ~Connection() {
    server_.open.erase(this);
    if (refuse_) --server_.refusing;
    {
      std::lock_guard lock(server_.live_mutex);
      --server_.live;
    }
    server_.live_changed.notify_all();
  }

  void start() {
    error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);
    const auto ep = stream_.socket().remote_endpoint(ignored);
    peer_ = fmt::format("{}:{}", ep.address().to_string(), ep.port());
    if (refuse_) {
      drain_after_ = true;
      write(server_.error_answer(
          503, FERRY_STATUS_FAILED_PRECONDITION,
          fmt::format("the control API has {} connections open, its limit; try again later",
                      server_.limits.max_connections)));
      return;
    }
    read_head();
  }

  // The server stops: a connection waiting for a client ends now, one running a handler
  // after its answer is written.
  void on_stop() {
    if (state_ == State::head || state_ == State::body || state_ == State::draining) close();
  }

 private:
  enum class State { head, body, running, writing, draining, closed };

  void read_head() {
    state_ = State::head;
    head_.emplace();
    head_->header_limit(static_cast<std::uint32_t>(server_.limits.max_header_bytes));
    // This parser reads no body: an announced length is judged in on_head, after the route.
    // (Not boost::none: Beast 1.74 compares a length with an empty limit as larger.)
    head_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(server_.limits.header_timeout);
    http::async_read_header(
        stream_, buffer_, *head_,
        [self = shared_from_this()](error_code ec, std::size_t) { self->on_head(ec); });
  }

  void on_head(const error_code& ec) {
    if (state_ == State::closed) return;
    if (ec) return read_failed(ec, "request head");
    const auto& h = head_->get();
    version_ = h.version();
    keep_alive_ = h.keep_alive();
    request_ = HttpRequest{};
    request_.method = std::string(h.method_string());
    const std::string_view target(h.target().data(), h.target().size());
    const auto question = target.find('?');
    request_.path = std::string(target.substr(0, question));
    if (question != std::string_view::npos)
      request_.query = std::string(target.substr(question + 1));
    request_.authorization = std::string(h[http::field::authorization]);
    const auto length = head_->content_length();
    const bool has_body = head_->chunked() || (length && *length > 0);
    try {
      dispatch_ = server_.router(request_);
    } catch (const std::exception& e) {
      logger("control")->error("routing {} {}: {}", request_.method, request_.path, e.what());
      dispatch_ = Dispatch{};
      dispatch_.answer = server_.error_answer(500, FERRY_STATUS_INTERNAL, e.what());
    }
    if (dispatch_.answer) {
      drain_after_ = has_body;
      return write(std::move(*dispatch_.answer));
    }
    if (length && *length > server_.limits.max_body_bytes) {
      drain_after_ = true;
      return write(too_large());
    }
    if (!has_body) return run();
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      // The client waits for this before it sends the body (curl does for large ones).
      auto interim =
          std::make_shared<http::response<http::empty_body>>(http::status::continue_, version_);
      stream_.expires_after(server_.limits.write_timeout);
      http::async_write(stream_, *interim,
                        [self = shared_from_this(), interim](error_code wec, std::size_t) {
                          if (wec) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    state_ = State::body;
    body_.emplace(std::move(*head_));
    head_.reset();
    // Counted as bytes arrive, chunk sizes included: a larger body fails before it is kept.
    body_->body_limit(static_cast<std::uint64_t>(server_.limits.max_body_bytes));
    stream_.expires_after(server_.limits.body_timeout);
    http::async_read(
        stream_, buffer_, *body_,
        [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
  }

  void on_body(const error_code& ec) {
    if (state_ == State::closed) return;
    if (ec == http::error::body_limit) {
      drain_after_ = true;
      return write(too_large());
    }
    if (ec) return read_failed(ec, "request body");
    request_.body = std::move(body_->get().body());
    body_.reset();
    run();
  }

  void read_failed(const error_code& ec, const char* phase) {
    if (is_disconnect(ec)) return close();
    if (ec == beast::error::timeout) {
      // The stream is closed already; an idle keep-alive is a normal end.
      logger("control")->debug("HTTP client {}: no complete {} within the deadline; closed", peer(),
                               phase);
      return close();
    }
    drain_after_ = true;
    if (ec == http::error::header_limit) {
      return write(server_.error_answer(431, FERRY_STATUS_INVALID_ARGUMENT,
                                        fmt::format("the request head is larger than {} bytes",
                                                    server_.limits.max_header_bytes)));
    }
    if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
      return write(server_.error_answer(400, FERRY_STATUS_INVALID_ARGUMENT,
                                        fmt::format("malformed HTTP {}: {}", phase, ec.message())));
    }
    logger("control")->debug("HTTP client {}: {} failed: {}", peer(), phase, ec.message());
    close();
  }

  HttpResponse too_large() const {
    return server_.error_answer(413, FERRY_STATUS_INVALID_ARGUMENT,
                                fmt::format("the request body is larger than the limit of {} bytes",
                                            server_.limits.max_body_bytes));
  }

  HttpResponse call_handler() noexcept {
    try {
      return dispatch_.handler(request_);
    } catch (const std::exception& e) {
      logger("control")->error("{} {}: {}", request_.method, request_.path, e.what());
      return server_.error_answer(500, FERRY_STATUS_INTERNAL, e.what());
    } catch (...) {
      return server_.error_answer(500, FERRY_STATUS_INTERNAL, "unknown exception");
    }
  }

  void run() {
    state_ = State::running;
    if (server_.stopping) {
      keep_alive_ = false;
      return write(server_.error_answer(503, FERRY_STATUS_ABORTED, "the receiver is stopping"));
    }
    if (dispatch_.thread == Dispatch::Thread::io) return write(call_handler());
    const int pool = dispatch_.thread == Dispatch::Thread::reads ? 0 : 1;
    if (server_.queued[pool] >= server_.limits.max_queued) {
      return write(server_.error_answer(
          503, FERRY_STATUS_FAILED_PRECONDITION,
          fmt::format("{} requests like this one are in progress, the limit; try again later",
                      server_.queued[pool])));
    }
    ++server_.queued[pool];
    // The client waits as long as the handler runs (an update can take minutes).
    stream_.expires_never();
    net::post(*server_.workers[pool], [self = shared_from_this(), pool]() mutable {
      HttpResponse answer = self->call_handler();
      auto& ioc = self->server_.ioc;
      net::post(ioc, [self = std::move(self), answer = std::move(answer), pool]() mutable {
        --self->server_.queued[pool];
        self->write(std::move(answer));
      });
    });
  }

  void write(HttpResponse answer) {
    if (state_ == State::closed) return;
    state_ = State::writing;
    response_ = {};
    response_.version(version_);
    response_.result(static_cast<unsigned>(answer.status));
    response_.set(http::field::server, "ferry");
    response_.set(http::field::content_type, answer.content_type);
    for (const auto& [name, value] : answer.headers) response_.set(name, value);
    response_.body() = std::move(answer.body);
    response_.keep_alive(keep_alive_ && !drain_after_ && !server_.stopping);
    response_.prepare_payload();
    stream_.expires_after(server_.limits.write_timeout);
    http::async_write(stream_, response_, [self = shared_from_this()](error_code ec, std::size_t) {
      self->on_write(ec);
    });
  }

  void on_write(const error_code& ec) {
    if (ec || state_ == State::closed) return close();
    if (drain_after_) return drain();
    // stop() may have come while this answer was written with keep-alive.
    if (!response_.keep_alive() || server_.stopping) return close();
    read_head();
  }

  // Half-closes and reads what the client still sends into one small buffer, for kDrainTime
  // at most, then closes.
  void drain() {
    state_ = State::draining;
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    discard_ = std::make_unique<char[]>(kDrainBuffer);
    stream_.expires_after(kDrainTime);
    drain_more();
  }
  void drain_more() {
    stream_.async_read_some(net::buffer(discard_.get(), kDrainBuffer),
                            [self = shared_from_this()](error_code ec, std::size_t) {
                              if (ec || self->state_ == State::closed) return self->close();
                              self->drain_more();
                            });
  }

  void close() {
    if (state_ == State::closed) return;
    state_ = State::closed;
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // Taken at accept: after a deadline the socket is closed and knows no peer.
  const std::string& peer() const { return peer_; }

  Server& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> head_;
  std::optional<http::request_parser<http::string_body>> body_;
  HttpRequest request_;
  Dispatch dispatch_;
  http::response<http::string_body> response_;
  std::unique_ptr<char[]> discard_;
  std::string peer_;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool drain_after_ = false;  // the request's body was not read (or not all of it)
  bool refuse_ = false;
  State state_ = State::head;
};

void Server::note_refusal() {
  ++refused_since_log;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log < std::chrono::seconds(10)) return;
  logger("control")->warn(
      "{} HTTP connection(s) refused: {} open, the limit (idle ones close after {} ms)",
      refused_since_log, limits.max_connections, limits.header_timeout.count());
  last_refusal_log = now;
  refused_since_log = 0;
}

void Server::accept() {
  acceptor.async_accept(ioc, [this](error_code ec, tcp::socket socket) {
    if (stopping || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of file descriptors, most often: retry shortly rather than spin.
      if (!accept_failing) {
        logger("control")->warn("cannot accept HTTP connections ({}; {} open); retrying",
                                ec.message(), open.size());
      }
      accept_failing = true;
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait([this](error_code tec) {
        if (!tec && !stopping) accept();
      });
      return;
    }
    if (accept_failing) logger("control")->info("accepting HTTP connections again");
    accept_failing = false;
    const bool refuse = open.size() - refusing >= limits.max_connections;
    if (refuse) note_refusal();
    if (refuse && refusing >= kMaxRefusing) {
      error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Connection>(*this, std::move(socket), refuse)->start();
    }
    accept();
  });
}

}  // namespace

struct HttpListener::Impl : Server {
  using Server::Server;
};

HttpListener::HttpListener(HttpLimits limits, Router router, ErrorAnswer error_answer)
    : impl_(std::make_unique<Impl>(limits, std::move(router), std::move(error_answer))) {}

HttpListener::~HttpListener() {
  stop();
}

int HttpListener::start(const std::string& host, int port) {
  auto& i = *impl_;
  if (i.started) fail(FERRY_STATUS_FAILED_PRECONDITION, "the HTTP listener runs already");
  const std::size_t files = raise_open_file_limit();
  if (files < i.limits.max_connections + 2 * kReservedFiles) {
    const std::size_t fit = files > 2 * kReservedFiles ? files - kReservedFiles : files / 2;
    logger("control")->warn(
        "open-file limit {} allows {} HTTP connections (not {}); raise `ulimit -Hn` for more",
        files, fit, i.limits.max_connections);
    i.limits.max_connections = fit;
  }
  try {
    tcp::resolver resolver(i.ioc);
    const auto results = resolver.resolve(host, std::to_string(port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service);
    const tcp::endpoint endpoint = *results.begin();
    i.acceptor.open(endpoint.protocol());
    i.acceptor.set_option(net::socket_base::reuse_address(true));
    i.acceptor.bind(endpoint);
    i.acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    error_code ignored;
    i.acceptor.close(ignored);
    fail(FERRY_STATUS_IO, "cannot listen on {}:{} ({})", host, port, e.code().message());
  }
  const int bound = i.acceptor.local_endpoint().port();
  for (auto& pool : i.workers) {
    pool = std::make_unique<net::thread_pool>(std::max(1u, i.limits.workers));
  }
  i.work.emplace(i.ioc.get_executor());
  i.accept();
  i.io_thread = std::thread([impl = &i] { impl->run_io(); });
  i.started = true;
  return bound;
}

void HttpListener::stop() {
  if (!impl_) return;
  auto& i = *impl_;
  if (!i.started || i.stopped) return;
  i.stopped = true;
  net::post(i.ioc, [impl = &i] {
    impl->stopping = true;
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->retry_timer.cancel();
    // on_stop may end a connection: iterate over a copy.
    const std::vector<Connection*> open(impl->open.begin(), impl->open.end());
    for (auto* c : open) c->on_stop();
  });
  for (auto& pool : i.workers) pool->join();  // handlers finish; answers go to the I/O thread
  {
    std::unique_lock lock(i.live_mutex);
    i.live_changed.wait_for(lock, i.limits.write_timeout + kDrainTime, [&] { return i.live == 0; });
  }
  i.work.reset();
  i.ioc.stop();
  if (i.io_thread.joinable()) i.io_thread.join();
}

std::size_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    // An unlimited hard limit is still bounded by the kernel's nr_open.
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? 1u << 20 : limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<std::size_t>(limit.rlim_cur);
}

}  // namespace ferry::control
