// The control API while an update stalls: a real Receiver (disk and dense plugins) behind a real
// ControlServer, and a session update that holds the update lock and sends nothing (what a
// stalled pusher does). Reads that wait for the lock pile up, yet /health, /metrics and
// /get_weight_version answer at once, a change is answered (409) rather than queued behind the
// waiting reads, and when the stall ends every waiting request gets its answer. In-process
// because only here can the test hold a session open without speaking the whole protocol.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <vector>

#include "config/config.hpp"
#include "control/http_server.hpp"
#include "raw_http.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(ControlStall, ReadsAndChangesAnswerWhileAnUpdateHoldsTheLock) {
  TempDir dir;
  const Checkpoint v1 = make_dense_checkpoint(
      DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 3);
  write_checkpoint(dir.path() / "v1", v1, 1);
  config::Config config;
  config.receiver.model_family = "dense";
  const fs::path disk = required_env("FERRY_DISK_PLUGIN");
  const fs::path dense = required_env("FERRY_DENSE_PLUGIN");
  registry::Registry registry({disk.parent_path(), dense.parent_path()});
  receiver::Receiver receiver(config, registry);
  receiver.update_from_disk(dir.path() / "v1", std::string("v1"));

  control::ServerOptions options;
  options.port = 0;
  control::ControlServer server(receiver, options);
  server.start();

  // The stalled update: holds the update lock until it is destroyed.
  const auto catalog = receiver.checkpoint_catalog();
  auto stalled = receiver.open_session(catalog, "");

  constexpr int kWaiting = 24;  // more than any worker pool
  const std::string read = R"({"name": "model.norm.weight", "truncate_size": 2})";
  std::vector<RawConnection> waiting;
  waiting.reserve(kWaiting);
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back(server.port());
    ASSERT_TRUE(
        waiting.back().send("POST /get_weights_by_name HTTP/1.1\r\nHost: t\r\n"
                            "Content-Length: " +
                            std::to_string(read.size()) + "\r\n\r\n" + read));
  }
  std::this_thread::sleep_for(200ms);  // every read is waiting for the lock

  for (const char* path : {"/health", "/metrics", "/get_weight_version", "/get_model_info",
                           "/model_info", "/server_info"}) {
    SCOPED_TRACE(path);
    RawConnection c(server.port());
    const auto start = Clock::now();
    ASSERT_TRUE(c.send(std::string("GET ") + path + " HTTP/1.1\r\nHost: t\r\n\r\n"));
    const auto text = c.read_answer(5s);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::cout << path << " during a stalled update with " << kWaiting << " reads waiting: " << ms
              << " ms\n";
    ASSERT_TRUE(text.has_value()) << "no answer while the update stalls";
    const RawAnswer a = parse_answer(*text);
    EXPECT_NE(a.status, 0);
    EXPECT_LT(ms, 1000.0) << "liveness bound";
  }
  {
    // A change does not wait behind the reads: the receiver refuses it (another update runs).
    RawConnection c(server.port());
    const std::string body = R"({"model_path": ")" + (dir.path() / "v1").string() + R"("})";
    ASSERT_TRUE(c.send("POST /update_weights_from_disk HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
    const auto text = c.read_answer(5s);
    ASSERT_TRUE(text.has_value()) << "the update request waited behind the stalled reads";
    const RawAnswer a = parse_answer(*text);
    EXPECT_EQ(a.status, 409) << *text;
  }

  stalled.reset();  // the stall ends (the session update is aborted)
  for (auto& c : waiting) {
    const auto text = c.read_answer(10s);
    ASSERT_TRUE(text.has_value()) << "a waiting read got no answer after the stall";
    const RawAnswer a = parse_answer(*text);
    EXPECT_EQ(a.status, 200) << *text;
    EXPECT_EQ(a.body.value("name", ""), "model.norm.weight");
  }
  server.stop();
}

}  // namespace
}  // namespace ferry::test
