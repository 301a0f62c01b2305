// The control API of a real `ferry serve` under hostile clients, over real sockets: bodies that
// pass the limit (chunked or announced) are refused before they are kept, and a mutating route's
// token is checked before any body byte is read; a thousand idle connections and a hundred slow
// ones leave /health answering and an update running; every error, the protocol's own included,
// is a JSON object; the session port bounds its connections and refuses the rest with a message.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "raw_http.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "load-test-token";
constexpr std::uint64_t kMiB = 1u << 20;

class ControlLoad : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(make_dense_checkpoint(
        DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 7));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 1);
    ServeOptions o;
    o.model_path = model_path();
    o.token = kToken;
    // The session handshake deadline is min(bucket timeout, 10 s): 6 s here, longer than
    // opening the session test's connections takes.
    o.sets = {"update.bucket_timeout_ms=6000"};
    serve_ = std::make_unique<ServeProcess>(o);
  }
  static void TearDownTestSuite() {
    serve_.reset();
    checkpoint_.reset();
    dir_.reset();
  }
  static std::string model_path() { return (dir_->path() / "model").string(); }
  static std::string auth_line() { return std::string("Authorization: Bearer ") + kToken + "\r\n"; }

  // Sends a chunked body of up to 1 GiB in 1 MiB chunks after `head` while waiting for the
  // answer; returns it. The server's peak RSS may grow by `max_growth` bytes at most.
  static RawAnswer chunked_flood(const std::string& head, std::uint64_t max_growth) {
    const std::uint64_t hwm_before = proc_status_value(serve_->pid(), "VmHWM") * 1024;
    RawConnection c(serve_->port());
    EXPECT_TRUE(c.send(head));
    std::atomic<bool> answered{false};
    std::atomic<std::uint64_t> sent{0};
    std::thread writer([&] {
      const std::string chunk = "100000\r\n" + std::string(kMiB, '{') + "\r\n";
      for (int i = 0; i < 1024 && !answered.load(); ++i) {
        if (!c.send(chunk)) return;
        sent += kMiB;
      }
      c.send("0\r\n\r\n");
    });
    const auto start = Clock::now();
    const auto text = c.read_answer(20s);
    answered = true;
    ::shutdown(c.fd(), SHUT_RDWR);  // ends a blocked send of the writer
    writer.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::uint64_t hwm_after = proc_status_value(serve_->pid(), "VmHWM") * 1024;
    std::cout << "answered after " << seconds << " s, " << sent.load() / kMiB
              << " MiB sent; server peak RSS " << hwm_before / kMiB << " -> " << hwm_after / kMiB
              << " MiB\n";
    EXPECT_LE(hwm_after, hwm_before + max_growth) << "the server kept the body: peak RSS grew by "
                                                  << (hwm_after - hwm_before) / kMiB << " MiB";
    EXPECT_TRUE(text.has_value()) << "no answer within 20 s";
    return text ? parse_answer(*text) : RawAnswer{};
  }

  static void expect_json_error(const RawAnswer& a, int status) {
    EXPECT_EQ(a.status, status) << a.head;
    ASSERT_TRUE(a.body.is_object()) << a.head;
    EXPECT_EQ(a.body.value("success", true), false) << a.body.dump();
    EXPECT_FALSE(a.body.value("message", "").empty()) << a.body.dump();
    EXPECT_FALSE(a.body.value("code", "").empty()) << a.body.dump();
    EXPECT_NE(a.head.find("application/json"), std::string::npos) << a.head;
  }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TempDir> ControlLoad::dir_;
std::unique_ptr<Checkpoint> ControlLoad::checkpoint_;
std::unique_ptr<ServeProcess> ControlLoad::serve_;

TEST_F(ControlLoad, ChunkedBodyWithoutTokenIsRefusedBeforeAnyOfItIsKept) {
  const RawAnswer a = chunked_flood(
      "POST /update_weights_from_disk HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n",
      48 * kMiB);
  expect_json_error(a, 401);
  EXPECT_NE(a.body.value("message", "").find("Authorization: Bearer"), std::string::npos);
  EXPECT_EQ(serve_->get("/health").status, 200);
}

TEST_F(ControlLoad, ChunkedBodyOverTheLimitIs413WithTheToken) {
  const RawAnswer a = chunked_flood(
      "POST /update_weights_from_disk HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
          auth_line() + "Transfer-Encoding: chunked\r\n\r\n",
      16 * kMiB + 48 * kMiB);
  expect_json_error(a, 413);
  EXPECT_NE(a.body.value("message", "").find("16777216"), std::string::npos) << a.body.dump();
  EXPECT_EQ(serve_->get("/health").status, 200);
}

TEST_F(ControlLoad, AnnouncedBodyOverTheLimitIs413BeforeItIsSent) {
  RawConnection c(serve_->port());
  ASSERT_TRUE(
      c.send("POST /get_weights_by_name HTTP/1.1\r\nHost: t\r\n"
             "Content-Length: 1073741824\r\n\r\n{"));
  const auto text = c.read_answer(5s);
  ASSERT_TRUE(text.has_value()) << "no answer before the body was sent";
  expect_json_error(parse_answer(*text), 413);
}

TEST_F(ControlLoad, IdleAndSlowConnectionsLeaveHealthAndUpdatesAnswering) {
  ASSERT_GE(raise_own_file_limit(), 1200u) << "this test needs 1200 open files";
  std::vector<RawConnection> idle;
  idle.reserve(1000);
  for (int i = 0; i < 1000; ++i) idle.emplace_back(serve_->port());
  std::vector<RawConnection> slow;
  slow.reserve(100);
  for (int i = 0; i < 100; ++i) {
    slow.emplace_back(serve_->port());
    ASSERT_TRUE(slow.back().send("GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: "));
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {  // one header byte per slow client every 100 ms
    while (!done.load()) {
      for (auto& c : slow) c.send("a");
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(300ms);  // every connection accepted and waiting

  const auto start = Clock::now();
  const Reply health = serve_->get("/health");
  const double health_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::cout << "/health with 1000 idle and 100 slow connections open: " << health_ms << " ms\n";
  EXPECT_EQ(health.status, 200) << health.text;
  EXPECT_LT(health_ms, 1000.0) << "liveness bound";

  const Reply update = serve_->update_from_disk(model_path());
  EXPECT_EQ(update.status, 200) << update.text;
  EXPECT_EQ(serve_->get("/get_weight_version").status, 200);
  // No thread per connection.
  EXPECT_LT(proc_status_value(serve_->pid(), "Threads"), 100u);
  done = true;
  trickle.join();
}

TEST_F(ControlLoad, EveryErrorIsAJsonObject) {
  struct Case {
    const char* name;
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {"post_without_body",
       "POST /update_weight_version HTTP/1.1\r\nHost: t\r\n" + auth_line() + "\r\n", 400},
      {"not_http", "HELLO THERE\r\n\r\n", 400},
      {"wrong_method", "GET /update_weights_from_disk HTTP/1.1\r\nHost: t\r\n\r\n", 405},
      {"unknown_route", "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", 404},
      {"no_token",
       "POST /release_memory_occupation HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}", 401},
      {"head_too_large",
       "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(20000, 'x') + "\r\n\r\n", 431},
      {"bad_chunk",
       "POST /get_weights_by_name HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       400},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawConnection conn(serve_->port());
    ASSERT_TRUE(conn.send(c.request));
    const auto text = conn.read_answer(5s);
    ASSERT_TRUE(text.has_value()) << "no answer";
    expect_json_error(parse_answer(*text), c.status);
  }
  EXPECT_EQ(serve_->get("/health").status, 200);
}

TEST_F(ControlLoad, SessionPortRefusesConnectionsOverItsLimitWithAMessage) {
  constexpr int kLimit = 256;  // kMaxSessionConnections of session/receiver_endpoint.cpp
  const Reply info = serve_->get("/ferry/session");
  ASSERT_EQ(info.status, 200) << info.text;
  const int port = info.body["port"].get<int>();
  const std::uint64_t threads_before = proc_status_value(serve_->pid(), "Threads");

  std::vector<RawConnection> held;
  held.reserve(kLimit);
  for (int i = 0; i < kLimit; ++i) held.emplace_back(port);
  // Every one accepted (a thread each) before the next arrives.
  const auto until = Clock::now() + 5s;
  while (proc_status_value(serve_->pid(), "Threads") < threads_before + kLimit &&
         Clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  RawConnection over(port);
  const auto refused = over.read_until_closed(1500ms);
  ASSERT_TRUE(refused.has_value()) << "the connection over the limit was kept open";
  EXPECT_NE(refused->find("its limit"), std::string::npos) << *refused;
  EXPECT_NE(refused->find(std::to_string(kLimit)), std::string::npos) << *refused;
  EXPECT_LE(proc_status_value(serve_->pid(), "Threads"), threads_before + kLimit + 2);

  // The handshake deadline (6 s here) ends connections that never send their Hello, even one
  // that sent half a frame.
  ASSERT_TRUE(held.front().send("FRY1"));
  const auto ended = held.front().read_until_closed(10s);
  EXPECT_TRUE(ended.has_value()) << "a connection without a Hello outlived the deadline";
  held.clear();
  const auto settle = Clock::now() + 8s;
  while (proc_status_value(serve_->pid(), "Threads") > threads_before + 2 &&
         Clock::now() < settle) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LE(proc_status_value(serve_->pid(), "Threads"), threads_before + 2);
  EXPECT_EQ(serve_->get("/health").status, 200);
}

// Every connection is a file: `ferry serve` started with a low soft limit raises it to the hard
// one.
TEST(ControlFiles, ServeRaisesItsOpenFileLimitToTheHardLimit) {
  rlimit own{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_max <= 512) GTEST_SKIP() << "the hard limit is too low to lower the soft one";
  rlimit low = own;
  low.rlim_cur = 512;  // inherited by the child
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::unique_ptr<ServeProcess> serve;
  try {
    serve = std::make_unique<ServeProcess>(ServeOptions{});
  } catch (...) {
    ::setrlimit(RLIMIT_NOFILE, &own);
    throw;
  }
  ::setrlimit(RLIMIT_NOFILE, &own);
  std::ifstream in("/proc/" + std::to_string(serve->pid()) + "/limits");
  std::string soft, hard;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(14));
    fields >> soft >> hard;
  }
  ASSERT_FALSE(soft.empty()) << "no open-file limit in /proc/PID/limits";
  EXPECT_EQ(soft, hard);
  EXPECT_NE(soft, "512");
}

}  // namespace
}  // namespace ferry::test
