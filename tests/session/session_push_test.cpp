// `ferry push` into real `ferry serve` processes over the session protocol: the weights every
// receiver rank holds afterwards are bit-identical (fingerprints) to the pushed checkpoint's
// shard, for one receiver, a receiver without weights (its layout comes from the session), and
// a fan-out to four receivers of which two are the ranks of a TP-2 group.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "session_fixture.hpp"

namespace ferry::test {
namespace {

class SessionPush : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }
  static std::unique_ptr<TwoVersions> versions_;
};
std::unique_ptr<TwoVersions> SessionPush::versions_;

TEST_F(SessionPush, PushIntoOneReceiverIsBitIdentical) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  ASSERT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  // 512-byte buckets: the model (~5 KiB) travels in many buckets through both slots.
  const auto push = run_ferry({"--log-level", "warn", "push", "--to", address_of(serve),
                               "--transport", "inline", "--model-path", versions_->v2_path(),
                               "--version", "7", "--bucket-bytes", "512"});
  ASSERT_TRUE(push.exited) << push.output;
  ASSERT_EQ(push.status, 0) << push.output;
  EXPECT_NE(push.output.find("committed version 7 via inline"), std::string::npos) << push.output;
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(version_of(serve), 7);
  EXPECT_EQ(serve.get("/health").status, 200);
}

TEST_F(SessionPush, FreshReceiverGetsItsLayoutFromTheFirstSession) {
  ServeProcess serve(receiver_options(""));
  EXPECT_EQ(serve.get("/health").status, 503);
  const auto push = run_ferry({"--log-level", "warn", "push", "--to", address_of(serve),
                               "--transport", "auto", "--model-path", versions_->v2_path(),
                               "--version", "1", "--bucket-bytes", "4096"});
  ASSERT_EQ(push.status, 0) << push.output;
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(serve.get("/health").status, 200);
}

TEST_F(SessionPush, FanOutToFourReceiversIncludingTwoTpRanksCommitsEverywhere) {
  std::vector<std::unique_ptr<ServeProcess>> receivers;
  receivers.push_back(std::make_unique<ServeProcess>(receiver_options(versions_->v1_path())));
  receivers.push_back(std::make_unique<ServeProcess>(receiver_options("")));
  receivers.push_back(std::make_unique<ServeProcess>(receiver_options(versions_->v1_path(), 0, 2)));
  receivers.push_back(std::make_unique<ServeProcess>(receiver_options(versions_->v1_path(), 1, 2)));
  std::string to;
  for (const auto& r : receivers) to += (to.empty() ? "" : ",") + address_of(*r);
  const auto push = run_ferry({"--log-level", "warn", "push", "--to", to, "--transport", "inline",
                               "--model-path", versions_->v2_path(), "--version", "3",
                               "--bucket-bytes", "1024"});
  ASSERT_EQ(push.status, 0) << push.output;
  EXPECT_NE(push.output.find("to 4/4 receivers"), std::string::npos) << push.output;
  const unsigned ranks[4][2] = {{0, 1}, {0, 1}, {0, 2}, {1, 2}};
  for (std::size_t i = 0; i < receivers.size(); ++i) {
    SCOPED_TRACE("receiver " + std::to_string(i));
    EXPECT_EQ(receivers[i]->fingerprints(),
              expected_fingerprints(versions_->v2, ranks[i][0], ranks[i][1]));
    EXPECT_EQ(version_of(*receivers[i]), 3);
  }
}

TEST_F(SessionPush, PushOverUcxIsBitIdentical) {
  if (std::getenv("FERRY_TEST_HAVE_UCX") == nullptr) {
    GTEST_SKIP() << "the ucx transport plugin is not built";
  }
  ServeOptions debug_a = receiver_options(versions_->v1_path());
  debug_a.log_level = "debug";
  ServeProcess a(debug_a);
  ServeProcess b(receiver_options(versions_->v1_path(), 1, 2));
  // UCX over tcp: buckets go by tagged sends into receives the receivers posted.
  const auto push = run_ferry({"--log-level", "warn", "push", "--to",
                               address_of(a) + "," + address_of(b), "--transport", "ucx",
                               "--model-path", versions_->v2_path(), "--version", "4",
                               "--bucket-bytes", "1024"},
                              {{"UCX_TLS", "tcp"}});
  ASSERT_EQ(push.status, 0) << push.output;
  EXPECT_NE(push.output.find("committed version 4 via ucx"), std::string::npos) << push.output;
  EXPECT_EQ(a.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(b.fingerprints(), expected_fingerprints(versions_->v2, 1, 2));
  // The sender's process is gone after a successful push: a session that ended, not an error.
  // Waited for where the receiver's transport notices it within 10 s (its debug line; how soon
  // UCX reports a peer gone depends on the load), then no error may be in either log.
  (void)eventually(
      [&] { return a.log().find("(nothing was being sent to it)") != std::string::npos; }, 10);
  EXPECT_EQ(a.log().find("[error]"), std::string::npos) << a.log();
  EXPECT_EQ(b.log().find("[error]"), std::string::npos) << b.log();
}

TEST_F(SessionPush, SessionIsAdvertisedOnTheControlApi) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto info = serve.get("/ferry/session");
  ASSERT_EQ(info.status, 200) << info.text;
  EXPECT_EQ(info.body.value("protocol", 0), 2);
  EXPECT_GT(info.body.value("port", 0), 0);
}

}  // namespace
}  // namespace ferry::test
