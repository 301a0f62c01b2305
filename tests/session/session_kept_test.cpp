// Kept sessions between pushes, against real `ferry serve` processes: a Sender's second push of
// the same tensors goes through the session kept from the first (no new handshake) and is
// bit-identical; an idle kept session blocks no other update; a release of the receiver's memory
// suspends the kept session first (the sender lets go of its data path) and the push after the
// resume rejoins it, a push while released is refused, a sender that does not rejoin has its
// session closed (the next push opens a new one); a
// receiver killed between pushes makes the next push fail with its address, without hanging;
// keep_sessions = false on either side opens a session per push.
#include <gtest/gtest.h>
#include <signal.h>

#include <functional>
#include <memory>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

class SessionKept : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }

  // An in-process sender of these tests' checkpoints over inline buckets of 512 bytes.
  // `adjust`: what a test sets beyond these options.
  static std::unique_ptr<session::Sender> make_sender(
      const std::vector<std::string>& receivers,
      const std::function<void(session::SenderOptions&)>& adjust = {},
      const config::Config& config = config_) {
    session::SenderOptions options;
    options.receivers = receivers;
    options.transport = "inline";
    options.bucket_bytes = 512;
    options.bucket_timeout = std::chrono::milliseconds(5000);
    options.commit_timeout = std::chrono::milliseconds(5000);
    if (adjust) adjust(options);
    return std::make_unique<session::Sender>(config, registry_, options);
  }

  static session::ReceiverResult push(session::Sender& sender, const Checkpoint& checkpoint,
                                      std::uint64_t version) {
    const auto views = views_of(checkpoint);
    const auto report = sender.push(views, version);
    EXPECT_EQ(report.receivers.size(), 1u);
    return report.receivers.at(0);
  }

  // A receiver of v1 whose log shows its sessions (info).
  static ServeOptions receiver() {
    auto options = receiver_options(versions_->v1_path());
    options.log_level = "info";
    return options;
  }

  static std::unique_ptr<TwoVersions> versions_;
  static config::Config config_;
  static registry::Registry registry_;
};
std::unique_ptr<TwoVersions> SessionKept::versions_;
config::Config SessionKept::config_;
registry::Registry SessionKept::registry_({});

TEST_F(SessionKept, LaterPushesGoThroughTheKeptSessionAndAreBitIdentical) {
  ServeProcess serve(receiver());
  auto sender = make_sender({address_of(serve)});
  const auto first = push(*sender, versions_->v2, 2);
  ASSERT_TRUE(first.committed) << first.error;
  EXPECT_FALSE(first.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));

  const auto second = push(*sender, versions_->v1, 3);
  ASSERT_TRUE(second.committed) << second.error;
  EXPECT_TRUE(second.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  const auto third = push(*sender, versions_->v2, 4);
  ASSERT_TRUE(third.committed) << third.error;
  EXPECT_TRUE(third.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(version_of(serve), 4);
  // One handshake for three updates.
  const std::string log = serve.log();
  std::size_t handshakes = 0;
  for (auto at = log.find("layout accepted"); at != std::string::npos;
       at = log.find("layout accepted", at + 1)) {
    ++handshakes;
  }
  EXPECT_EQ(handshakes, 1u) << log;
}

TEST_F(SessionKept, AnIdleKeptSessionBlocksNoOtherUpdate) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  auto a = make_sender({address_of(serve)});
  auto b = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*a, versions_->v2, 2).committed);
  // A's session is kept and idle: B's session and B's update are not refused as "another
  // update is in progress", and then A's kept session still works.
  const auto from_b = push(*b, versions_->v1, 3);
  ASSERT_TRUE(from_b.committed) << from_b.error;
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  const auto from_a = push(*a, versions_->v2, 4);
  ASSERT_TRUE(from_a.committed) << from_a.error;
  EXPECT_TRUE(from_a.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The colocated RL loop: the receiver releases its memory (the trainer's step), resumes, and the
// next push goes through the same session: suspended by the release, rejoined by the push, no
// new handshake.
TEST_F(SessionKept, ReleaseSuspendsTheKeptSessionAndThePushAfterTheResumeRejoinsIt) {
  ServeProcess serve(receiver());
  auto sender = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  for (std::uint64_t v = 3; v <= 5; ++v) {
    const Reply release = serve.post("/release_memory_occupation", json::object(), serve.auth());
    ASSERT_EQ(release.status, 200) << release.text;
    const Reply resume = serve.post("/resume_memory_occupation", json::object(), serve.auth());
    ASSERT_EQ(resume.status, 200) << resume.text;
    const auto& checkpoint = v % 2 == 0 ? versions_->v2 : versions_->v1;
    const auto after = push(*sender, checkpoint, v);
    ASSERT_TRUE(after.committed) << after.error;
    EXPECT_TRUE(after.reused_session) << "push " << v;
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(checkpoint, 0, 1)) << "push " << v;
  }
  EXPECT_EQ(version_of(serve), 5);
  const std::string log = serve.log();
  // The receiver told the sender and waited for it to let go, rather than cutting it off.
  EXPECT_EQ(count_of(log, "1 kept session(s) suspended and 0 closed"), 3u) << log;
  EXPECT_EQ(count_of(log, "rejoined after the release: data path inline"), 3u) << log;
  EXPECT_EQ(count_of(log, "layout accepted"), 1u) << log;
  EXPECT_EQ(log.find("did not suspend its kept session"), std::string::npos) << log;
}

// The receiver tells a suspended session's sender when its memory is back (Message.resumed):
// the sender's watcher rejoins then, before the next push, which finds the session ready. Three
// cycles, each waiting for the rejoin in the receiver's log before pushing.
TEST_F(SessionKept, TheSenderRejoinsWhenTheReceiverResumesBeforeItsNextPush) {
  ServeProcess serve(receiver());
  auto sender = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  for (std::uint64_t v = 3; v <= 5; ++v) {
    const std::size_t rejoins = v - 2;
    const Reply release = serve.post("/release_memory_occupation", json::object(), serve.auth());
    ASSERT_EQ(release.status, 200) << release.text;
    // Released: nothing rejoins (the receiver would refuse it).
    EXPECT_EQ(count_of(serve.log(), "rejoined after the release"), rejoins - 1) << serve.log();
    const Reply resume = serve.post("/resume_memory_occupation", json::object(), serve.auth());
    ASSERT_EQ(resume.status, 200) << resume.text;
    EXPECT_TRUE(eventually(
        [&] { return count_of(serve.log(), "rejoined after the release") == rejoins; }, 10))
        << "no rejoin before push " << v << ": " << serve.log();
    const auto& checkpoint = v % 2 == 0 ? versions_->v2 : versions_->v1;
    const auto after = push(*sender, checkpoint, v);
    ASSERT_TRUE(after.committed) << after.error;
    EXPECT_TRUE(after.reused_session) << "push " << v;
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(checkpoint, 0, 1)) << "push " << v;
  }
  const std::string log = serve.log();
  EXPECT_EQ(count_of(log, "1 suspended kept session(s) told the memory is back"), 3u) << log;
  EXPECT_EQ(count_of(log, "rejoined after the release"), 3u) << log;
  EXPECT_EQ(count_of(log, "layout accepted"), 1u) << log;
}

// Two senders with kept sessions on one receiver, both told of the resume at once: their rejoins
// meet at the receiver's update lock, the second waits for the first rather than being refused,
// and both next pushes go through their kept sessions.
TEST_F(SessionKept, TwoSendersToldOfTheResumeBothRejoin) {
  ServeProcess serve(receiver());
  auto a = make_sender({address_of(serve)});
  auto b = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*a, versions_->v2, 2).committed);
  ASSERT_TRUE(push(*b, versions_->v1, 3).committed);
  for (int cycle = 0; cycle < 3; ++cycle) {
    ASSERT_EQ(serve.post("/release_memory_occupation", json::object(), serve.auth()).status, 200);
    ASSERT_EQ(serve.post("/resume_memory_occupation", json::object(), serve.auth()).status, 200);
    const std::size_t rejoins = 2 * (cycle + 1);
    EXPECT_TRUE(eventually(
        [&] { return count_of(serve.log(), "rejoined after the release") == rejoins; }, 10))
        << serve.log();
  }
  const auto from_a = push(*a, versions_->v1, 4);
  ASSERT_TRUE(from_a.committed) << from_a.error;
  EXPECT_TRUE(from_a.reused_session);
  const auto from_b = push(*b, versions_->v2, 5);
  ASSERT_TRUE(from_b.committed) << from_b.error;
  EXPECT_TRUE(from_b.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  const std::string log = serve.log();
  EXPECT_EQ(log.find("another update is in progress"), std::string::npos) << log;
  EXPECT_EQ(count_of(log, "2 suspended kept session(s) told the memory is back"), 3u) << log;
}

// A sender that rejoins only at its next push (SenderOptions::rejoin_when_resumed = false, as a
// sender of an earlier release, or the configuration's update.rejoin_when_resumed = false) is
// not told of the resume, and its push rejoins as before.
void expect_told_nothing_and_rejoined_at_the_push(ServeProcess& serve, session::Sender& sender,
                                                  const TwoVersions& versions);

TEST_F(SessionKept, ASenderThatRejoinsAtItsPushIsNotToldOfTheResume) {
  ServeProcess serve(receiver());
  auto owned = make_sender({address_of(serve)},
                           [](session::SenderOptions& o) { o.rejoin_when_resumed = false; });
  expect_told_nothing_and_rejoined_at_the_push(serve, *owned, *versions_);
}

TEST_F(SessionKept, ASenderConfiguredToRejoinAtItsPushIsNotToldOfTheResume) {
  ServeProcess serve(receiver());
  config::Config config = config_;
  config::apply_override(config, "update.rejoin_when_resumed=false");
  auto owned = make_sender({address_of(serve)}, {}, config);
  expect_told_nothing_and_rejoined_at_the_push(serve, *owned, *versions_);
}

void expect_told_nothing_and_rejoined_at_the_push(ServeProcess& serve, session::Sender& sender,
                                                  const TwoVersions& versions) {
  auto push = [&](const Checkpoint& checkpoint, std::uint64_t version) {
    const auto views = views_of(checkpoint);
    return sender.push(views, version).receivers.at(0);
  };
  ASSERT_TRUE(push(versions.v2, 2).committed);
  ASSERT_EQ(serve.post("/release_memory_occupation", json::object(), serve.auth()).status, 200);
  ASSERT_EQ(serve.post("/resume_memory_occupation", json::object(), serve.auth()).status, 200);
  // Given the time a told sender takes to rejoin (the test above), nothing comes.
  EXPECT_FALSE(
      eventually([&] { return count_of(serve.log(), "rejoined after the release") > 0; }, 1.0))
      << serve.log();
  EXPECT_EQ(serve.log().find("told the memory is back"), std::string::npos) << serve.log();
  const auto after = push(versions.v1, 3);
  ASSERT_TRUE(after.committed) << after.error;
  EXPECT_TRUE(after.reused_session);
  EXPECT_EQ(count_of(serve.log(), "rejoined after the release"), 1u) << serve.log();
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions.v1, 0, 1));
}

// Release, resume and push with no pause, twenty times: the sender's watcher rejoining on the
// receiver's word and the push taking the session back race every way they can (the push's own
// rejoin then reads the word before its Rejoined); every push commits through the kept session.
TEST_F(SessionKept, ReleaseResumeAndPushBackToBackEveryPushCommitsThroughTheKeptSession) {
  ServeProcess serve(receiver());
  auto sender = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  for (std::uint64_t v = 3; v < 23; ++v) {
    ASSERT_EQ(serve.post("/release_memory_occupation", json::object(), serve.auth()).status, 200);
    ASSERT_EQ(serve.post("/resume_memory_occupation", json::object(), serve.auth()).status, 200);
    const auto& checkpoint = v % 2 == 0 ? versions_->v2 : versions_->v1;
    const auto after = push(*sender, checkpoint, v);
    ASSERT_TRUE(after.committed) << "push " << v << ": " << after.error;
    EXPECT_TRUE(after.reused_session) << "push " << v;
  }
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));  // push 22's
  const std::string log = serve.log();
  EXPECT_EQ(count_of(log, "rejoined after the release"), 20u) << log;
  EXPECT_EQ(count_of(log, "layout accepted"), 1u) << log;
}

// A push while the memory is released: the rejoin is refused naming why, and nothing changes;
// after the resume the next push opens a new session, which is kept again.
TEST_F(SessionKept, APushWhileReleasedIsRefusedAndThePushAfterTheResumeCommits) {
  ServeProcess serve(receiver());
  auto sender = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  const Reply release = serve.post("/release_memory_occupation", json::object(), serve.auth());
  ASSERT_EQ(release.status, 200) << release.text;
  const auto while_released = push(*sender, versions_->v1, 3);
  EXPECT_FALSE(while_released.committed);
  EXPECT_FALSE(while_released.reused_session);
  EXPECT_NE(while_released.error.find("released"), std::string::npos) << while_released.error;
  EXPECT_EQ(version_of(serve), 2);

  const Reply resume = serve.post("/resume_memory_occupation", json::object(), serve.auth());
  ASSERT_EQ(resume.status, 200) << resume.text;
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  const auto after = push(*sender, versions_->v1, 4);
  ASSERT_TRUE(after.committed) << after.error;
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  const auto kept_again = push(*sender, versions_->v2, 5);
  ASSERT_TRUE(kept_again.committed) << kept_again.error;
  EXPECT_TRUE(kept_again.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
}

// A sender that does not rejoin (SenderOptions::rejoin_after_release = false, as a sender of an
// earlier release): the release closes its kept session and the next push opens a new one.
TEST_F(SessionKept, ReleaseClosesTheKeptSessionOfASenderThatDoesNotRejoin) {
  ServeProcess serve(receiver());
  auto owned = make_sender({address_of(serve)},
                           [](session::SenderOptions& o) { o.rejoin_after_release = false; });
  session::Sender& sender = *owned;
  ASSERT_TRUE(push(sender, versions_->v2, 2).committed);
  const Reply release = serve.post("/release_memory_occupation", json::object(), serve.auth());
  ASSERT_EQ(release.status, 200) << release.text;
  const std::string log = serve.log();
  EXPECT_NE(log.find("0 kept session(s) suspended and 1 closed"), std::string::npos) << log;
  EXPECT_EQ(log.find("did not close its kept session"), std::string::npos) << log;
  const Reply resume = serve.post("/resume_memory_occupation", json::object(), serve.auth());
  ASSERT_EQ(resume.status, 200) << resume.text;
  const auto after = push(sender, versions_->v1, 3);
  ASSERT_TRUE(after.committed) << after.error;
  EXPECT_FALSE(after.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
}

TEST_F(SessionKept, AReceiverKilledBetweenPushesFailsTheNextPushWithItsAddress) {
  auto serve = std::make_unique<ServeProcess>(receiver_options(versions_->v1_path()));
  const std::string address = address_of(*serve);
  auto sender = make_sender({address});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  ::kill(serve->pid(), SIGKILL);
  serve.reset();
  const auto next = push(*sender, versions_->v1, 3);
  EXPECT_FALSE(next.committed);
  EXPECT_FALSE(next.reused_session);
  EXPECT_NE(next.error.find(address), std::string::npos) << next.error;
}

TEST_F(SessionKept, WithoutKeepSessionsEveryPushOpensItsOwnSession) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  auto sender =
      make_sender({address_of(serve)}, [](session::SenderOptions& o) { o.keep_sessions = false; });
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  const auto second = push(*sender, versions_->v1, 3);
  ASSERT_TRUE(second.committed) << second.error;
  EXPECT_FALSE(second.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
}

TEST_F(SessionKept, AReceiverThatKeepsNoSessionsGetsOnePerPush) {
  auto options = receiver();
  options.sets.push_back("update.keep_sessions=false");
  ServeProcess serve(options);
  auto sender = make_sender({address_of(serve)});
  ASSERT_TRUE(push(*sender, versions_->v2, 2).committed);
  const auto second = push(*sender, versions_->v1, 3);
  ASSERT_TRUE(second.committed) << second.error;
  EXPECT_FALSE(second.reused_session);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
}

}  // namespace
}  // namespace ferry::test
