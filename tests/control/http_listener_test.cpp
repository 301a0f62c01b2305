// control/http_listener: its deadlines and bounds with short settings, over real sockets: a
// request head or body that does not arrive in time and an idle keep-alive are closed,
// connections over the limit and requests over a pool's queue are answered 503 with the error
// answer, stop() lets a running handler's answer go out, "Expect: 100-continue" is answered.
#include "control/http_listener.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "raw_http.hpp"

namespace ferry::control {
namespace {

using namespace std::chrono_literals;
using test::parse_answer;
using test::RawConnection;

HttpResponse error_answer(int status, ferry_status_code_t, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = nlohmann::json{{"success", false}, {"message", message}, {"code", "X"}}.dump();
  return r;
}

// /wait blocks (on the changes' pool) until release() is called; /ok answers on the I/O thread.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> entered{0};
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

HttpListener::Router router(Gate& gate) {
  return [&gate](const HttpRequest& head) {
    Dispatch d;
    if (head.path == "/wait") {
      d.thread = Dispatch::Thread::changes;
      d.handler = [&gate](const HttpRequest&) {
        ++gate.entered;
        std::unique_lock lock(gate.m);
        gate.cv.wait(lock, [&] { return gate.open; });
        HttpResponse r;
        r.body = R"({"waited": true})";
        return r;
      };
    } else {
      d.handler = [](const HttpRequest&) {
        HttpResponse r;
        r.body = R"({"ok": true})";
        return r;
      };
    }
    return d;
  };
}

const std::string kGetOk = "GET /ok HTTP/1.1\r\nHost: t\r\n\r\n";

TEST(HttpListener, SlowHeadSlowBodyAndIdleKeepAliveAreClosedAtTheDeadline) {
  Gate gate;
  HttpLimits limits;
  limits.header_timeout = 300ms;
  limits.body_timeout = 300ms;
  HttpListener listener(limits, router(gate), error_answer);
  const int port = listener.start("127.0.0.1", 0);

  RawConnection slow_body(port);
  ASSERT_TRUE(slow_body.send("POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n{}"));
  EXPECT_TRUE(slow_body.read_until_closed(3s).has_value()) << "a slow body outlived the deadline";

  RawConnection slow(port);
  ASSERT_TRUE(slow.send("GET /ok HTTP/1.1\r\nHo"));
  EXPECT_TRUE(slow.read_until_closed(3s).has_value()) << "a slow head outlived the deadline";

  RawConnection keep(port);
  ASSERT_TRUE(keep.send(kGetOk));
  const auto first = keep.read_answer(2s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(parse_answer(*first).status, 200);
  EXPECT_TRUE(keep.read_until_closed(3s).has_value()) << "an idle keep-alive stayed open";
  listener.stop();
}

// curl sends large bodies only after "100 Continue".
TEST(HttpListener, ExpectContinueIsAnsweredBeforeTheBodyIsRead) {
  Gate gate;
  HttpListener listener(HttpLimits{}, router(gate), error_answer);
  const int port = listener.start("127.0.0.1", 0);
  RawConnection c(port);
  ASSERT_TRUE(
      c.send("POST /ok HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
             "Content-Length: 2\r\n\r\n"));
  const auto interim = c.read_answer(2s);
  ASSERT_TRUE(interim.has_value()) << "no 100 Continue";
  EXPECT_EQ(parse_answer(*interim).status, 100) << *interim;
  ASSERT_TRUE(c.send("{}"));
  const auto answer = c.read_answer(2s);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(parse_answer(*answer).status, 200) << *answer;
  listener.stop();
}

TEST(HttpListener, ConnectionsOverTheLimitAre503AndTheOthersStillAnswer) {
  Gate gate;
  HttpLimits limits;
  limits.max_connections = 8;
  HttpListener listener(limits, router(gate), error_answer);
  const int port = listener.start("127.0.0.1", 0);
  std::vector<RawConnection> held;
  for (int i = 0; i < 8; ++i) held.emplace_back(port);
  std::this_thread::sleep_for(100ms);
  RawConnection over(port);
  const auto refused = over.read_answer(2s);
  ASSERT_TRUE(refused.has_value());
  const auto a = parse_answer(*refused);
  EXPECT_EQ(a.status, 503);
  EXPECT_NE(a.body.value("message", "").find("8 connections open"), std::string::npos) << *refused;
  ASSERT_TRUE(held[0].send(kGetOk));
  const auto ok = held[0].read_answer(2s);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(parse_answer(*ok).status, 200);
  listener.stop();
}

TEST(HttpListener, RequestsOverAPoolsQueueAre503AndStopDeliversRunningAnswers) {
  Gate gate;
  HttpLimits limits;
  limits.workers = 1;
  limits.max_queued = 2;
  HttpListener listener(limits, router(gate), error_answer);
  const int port = listener.start("127.0.0.1", 0);
  std::vector<RawConnection> waiting;
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back(port);
    ASSERT_TRUE(waiting.back().send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n"));
  }
  while (gate.entered.load() < 1) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(50ms);
  RawConnection third(port);
  ASSERT_TRUE(third.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n"));
  const auto busy = third.read_answer(2s);
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(parse_answer(*busy).status, 503) << *busy;
  // The I/O thread still answers.
  RawConnection ok(port);
  ASSERT_TRUE(ok.send(kGetOk));
  ASSERT_TRUE(ok.read_answer(2s).has_value());

  std::thread stopper([&] { listener.stop(); });
  std::this_thread::sleep_for(100ms);
  gate.release();
  stopper.join();
  for (auto& c : waiting) {
    const auto answer = c.read_answer(2s);
    ASSERT_TRUE(answer.has_value()) << "stop() dropped a running request's answer";
    EXPECT_EQ(parse_answer(*answer).status, 200);
  }
}

}  // namespace
}  // namespace ferry::control
