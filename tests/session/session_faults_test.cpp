// Faults during a push into real `ferry serve` processes: a receiver killed (SIGKILL) or stopped
// (SIGSTOP) at bucket k is reported by its address while the others commit; a sender killed or
// stalled at bucket k makes every receiver abort on its own, keeping its previous version and
// weights (and staying healthy).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <thread>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session_fixture.hpp"

namespace ferry::test {
namespace {

class SessionFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }

  // An in-process sender of v2 to `receivers` with 512-byte buckets (about ten buckets).
  session::PushReport push_v2(const std::vector<std::string>& receivers,
                              std::function<void(const std::string&, std::uint32_t)> hook,
                              std::chrono::milliseconds bucket_timeout) {
    config::Config config;
    registry::Registry registry({});
    session::SenderOptions options;
    options.receivers = receivers;
    options.transport = "inline";
    options.bucket_bytes = 512;
    options.bucket_timeout = bucket_timeout;
    options.commit_timeout = bucket_timeout;
    options.after_bucket = std::move(hook);
    session::Sender sender(config, registry, options);
    const auto views = views_of(versions_->v2);
    return sender.push(views, 2);
  }

  // The receiver kept version 1 with exactly the v1 weights and serves them.
  static void expect_unchanged(const ServeProcess& serve) {
    EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20))
        << serve.get("/health").text << serve.log();
    EXPECT_EQ(version_of(serve), 1);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  }

  static std::unique_ptr<TwoVersions> versions_;
};
std::unique_ptr<TwoVersions> SessionFaults::versions_;

TEST_F(SessionFaults, ReceiverKilledAtBucketThreeIsReportedWhileTheOthersCommit) {
  ServeProcess a(receiver_options(versions_->v1_path()));
  ServeProcess b(receiver_options(versions_->v1_path()));
  ServeProcess c(receiver_options(versions_->v1_path()));
  const std::string victim = address_of(b);
  const pid_t victim_pid = b.pid();
  const auto report = push_v2(
      {address_of(a), victim, address_of(c)},
      [&](const std::string& receiver, std::uint32_t bucket) {
        if (receiver == victim && bucket == 3) ::kill(victim_pid, SIGKILL);
      },
      std::chrono::milliseconds(5000));
  ASSERT_EQ(report.receivers.size(), 3u);
  EXPECT_TRUE(report.receivers[0].committed) << report.receivers[0].error;
  EXPECT_TRUE(report.receivers[2].committed) << report.receivers[2].error;
  EXPECT_FALSE(report.receivers[1].committed);
  EXPECT_NE(report.receivers[1].error.find(victim), std::string::npos) << report.receivers[1].error;
  EXPECT_EQ(a.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(c.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(version_of(a), 2);
  EXPECT_EQ(version_of(c), 2);
}

TEST_F(SessionFaults, ReceiverStalledPastTheDeadlineIsReportedWithThePhase) {
  ServeProcess a(receiver_options(versions_->v1_path()));
  ServeProcess b(receiver_options(versions_->v1_path(), 0, 1, 60000));
  const std::string stalled = address_of(b);
  const pid_t stalled_pid = b.pid();
  const auto report = push_v2(
      {address_of(a), stalled},
      [&](const std::string& receiver, std::uint32_t bucket) {
        if (receiver == stalled && bucket == 2) ::kill(stalled_pid, SIGSTOP);
      },
      std::chrono::milliseconds(1500));
  ::kill(stalled_pid, SIGCONT);
  ASSERT_EQ(report.receivers.size(), 2u);
  EXPECT_TRUE(report.receivers[0].committed) << report.receivers[0].error;
  EXPECT_FALSE(report.receivers[1].committed);
  const std::string& error = report.receivers[1].error;
  EXPECT_NE(error.find(stalled), std::string::npos) << error;
  EXPECT_NE(error.find("deadline"), std::string::npos) << error;
  EXPECT_NE(error.find("bucket"), std::string::npos) << error;
  EXPECT_EQ(version_of(a), 2);
  // Resumed, the stalled receiver finds the session gone and keeps version 1.
  expect_unchanged(b);
}

TEST_F(SessionFaults, AbortFromAnotherThreadFailsEveryReceiverAndKeepsTheirVersion) {
  ServeProcess a(receiver_options(versions_->v1_path()));
  ServeProcess b(receiver_options(versions_->v1_path()));
  config::Config config;
  registry::Registry registry({});
  session::SenderOptions options;
  options.receivers = {address_of(a), address_of(b)};
  options.transport = "inline";
  options.bucket_bytes = 512;
  session::Sender* running = nullptr;
  std::atomic<int> at_bucket_two{0};
  std::atomic<bool> aborted{false};
  options.after_bucket = [&](const std::string&, std::uint32_t bucket) {
    if (bucket != 2) return;
    // When both sessions are at bucket 2 (neither can have committed), another thread aborts
    // the whole push; the first session to arrive waits for that.
    if (at_bucket_two.fetch_add(1) + 1 == 2) {
      std::thread([&] { running->abort("the trainer stopped"); }).join();
      aborted = true;
    } else {
      eventually([&] { return aborted.load(); }, 10);
    }
  };
  session::Sender sender(config, registry, options);
  running = &sender;
  const auto views = views_of(versions_->v2);
  const auto report = sender.push(views, 2);
  ASSERT_EQ(report.receivers.size(), 2u);
  for (const auto& r : report.receivers) {
    EXPECT_FALSE(r.committed) << r.address;
    EXPECT_NE(r.error.find("the trainer stopped"), std::string::npos) << r.error;
    EXPECT_EQ(r.code, FERRY_STATUS_ABORTED) << r.error;
  }
  expect_unchanged(a);
  expect_unchanged(b);
}

TEST_F(SessionFaults, SenderKilledAtBucketTwoLeavesEveryReceiverAtItsVersion) {
  ServeProcess a(receiver_options(versions_->v1_path()));
  ServeProcess b(receiver_options(versions_->v1_path()));
  PushProcess push({"--log-level", "warn", "push", "--to", address_of(a) + "," + address_of(b),
                    "--transport", "inline", "--model-path", versions_->v2_path(), "--version",
                    "2", "--bucket-bytes", "512", "--test-exit-after-bucket", "2"},
                   {});
  ChildResult result;
  ASSERT_TRUE(push.wait(60, result));
  EXPECT_FALSE(result.exited) << result.output;
  EXPECT_EQ(result.status, SIGKILL);
  expect_unchanged(a);
  expect_unchanged(b);
  // Each receiver aborted the update it had begun.
  EXPECT_TRUE(eventually([&] {
    return a.get("/metrics").text.find("ferry_updates_aborted_total 1") != std::string::npos;
  }, 10)) << a.get("/metrics").text;
}

TEST_F(SessionFaults, SenderStalledAtBucketOneMakesEveryReceiverAbortAtItsDeadline) {
  ServeProcess a(receiver_options(versions_->v1_path(), 0, 1, 1500));
  ServeProcess b(receiver_options(versions_->v1_path(), 0, 1, 1500));
  PushProcess push({"--log-level", "warn", "push", "--to", address_of(a) + "," + address_of(b),
                    "--transport", "inline", "--model-path", versions_->v2_path(), "--version",
                    "2", "--bucket-bytes", "512", "--test-stall-after-bucket", "1"},
                   {});
  for (const ServeProcess* r : {&a, &b}) {
    EXPECT_TRUE(eventually([&] {
      return r->get("/metrics").text.find("ferry_updates_aborted_total 1") != std::string::npos;
    }, 30)) << r->log();
    EXPECT_NE(r->log().find("no answer before the deadline"), std::string::npos) << r->log();
    expect_unchanged(*r);
  }
  push.kill_now();
}

}  // namespace
}  // namespace ferry::test
