// A real `ferry push` that stalls after its first bucket (--test-stall-after-bucket)
// holds a real `ferry serve`'s update lock; reads that wait for the lock pile up behind it, yet
// /health and /get_weight_version answer at once, an update from disk is refused (409) rather
// than queued behind the waiting reads, and when the pusher goes every waiting read is answered.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include "raw_http.hpp"
#include "tests/session/session_fixture.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(ServeStalledPush, HealthAndChangesAnswerWhileAPushStallsHoldingTheLock) {
  TempDir dir;
  const auto f32 = [](const std::string&) { return FERRY_DTYPE_F32; };
  write_checkpoint(dir.path() / "v1", make_dense_checkpoint(DenseShape{}, f32, 1), 1);
  write_checkpoint(dir.path() / "v2", make_dense_checkpoint(DenseShape{}, f32, 2), 1);
  // The stall lasts until the test ends it: the receiver's deadlines are long.
  ServeProcess serve(receiver_options((dir.path() / "v1").string(), 0, 1, 60000));
  PushProcess push({"--log-level", "warn", "push", "--to", address_of(serve), "--transport",
                    "inline", "--model-path", (dir.path() / "v2").string(), "--version", "2",
                    "--bucket-bytes", "512", "--test-stall-after-bucket", "1"},
                   {});
  ASSERT_TRUE(eventually([&] { return serve.get("/health").body.value("state", "") == "updating"; },
                         30))
      << serve.log();

  constexpr int kWaiting = 24;  // more than any worker pool
  const std::string read = R"({"name": "model.norm.weight", "truncate_size": 2})";
  std::vector<RawConnection> waiting;
  waiting.reserve(kWaiting);
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back(serve.port());
    ASSERT_TRUE(waiting.back().send("POST /get_weights_by_name HTTP/1.1\r\nHost: t\r\n"
                                    "Content-Length: " +
                                    std::to_string(read.size()) + "\r\n\r\n" + read));
  }
  std::this_thread::sleep_for(300ms);  // every read waits for the lock

  for (const char* path : {"/health", "/get_weight_version", "/metrics"}) {
    SCOPED_TRACE(path);
    const auto start = Clock::now();
    const Reply r = serve.get(path);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::cout << path << " during a stalled push with " << kWaiting << " reads waiting: " << ms
              << " ms\n";
    EXPECT_NE(r.status, 0) << "no answer";
    EXPECT_LT(ms, 1000.0) << "liveness bound";
  }
  const Reply update = serve.update_from_disk((dir.path() / "v1").string());
  EXPECT_EQ(update.status, 409) << update.text;

  push.kill_now();  // the session ends; the receiver aborts the update
  for (auto& c : waiting) {
    const auto text = c.read_answer(20s);
    ASSERT_TRUE(text.has_value()) << "a waiting read got no answer after the push ended";
    const RawAnswer a = parse_answer(*text);
    EXPECT_EQ(a.status, 200) << *text;
  }
  EXPECT_EQ(version_of(serve), 1);
}

}  // namespace
}  // namespace ferry::test
