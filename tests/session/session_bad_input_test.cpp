// Bad input on a real `ferry serve`'s session and control ports: a layout that does not match
// (the refusal names the tensor), a wrong protocol version, garbage bytes, an oversize frame and
// a manifest that lies about its bucket's size are each refused with a message; nothing is
// applied, and the receiver stays healthy at its version with its weights.
#include <ferry/sdk/manifest.hpp>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/channel.hpp"
#include "session_fixture.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
namespace wire = session::wire;

class SessionBadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    versions_ = std::make_unique<TwoVersions>();
    serve_ = std::make_unique<ServeProcess>(receiver_options(versions_->v1_path()));
  }
  static void TearDownTestSuite() {
    serve_.reset();
    versions_.reset();
  }
  void TearDown() override {
    // Whatever a case sent, the receiver is healthy, at version 1, with the v1 weights.
    EXPECT_TRUE(eventually([] { return serve_->get("/health").status == 200; }, 20))
        << serve_->log();
    EXPECT_EQ(version_of(*serve_), 1);
    EXPECT_EQ(serve_->fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  }

  static int session_port() { return serve_->get("/ferry/session").body.value("port", 0); }

  static std::unique_ptr<session::Channel> connect() {
    const int fd = session::connect_tcp("127.0.0.1", session_port(),
                                        session::deadline_in(5000ms), "test");
    return std::make_unique<session::Channel>(fd, "receiver");
  }

  // Sends a Hello with the v2 catalog (same layout as v1) and `protocol`; with `lends_tensors`,
  // claiming to lend its tensors to be read in place.
  static void send_hello(session::Channel& ch, std::uint32_t protocol,
                         bool lends_tensors = false) {
    capnp::MallocMessageBuilder m;
    auto hello = m.initRoot<wire::Message>().initHello();
    hello.setProtocolVersion(protocol);
    hello.setSenderName("bad-input test");
    const auto& tensors = versions_->v2.tensors;
    auto list = hello.initTensors(static_cast<unsigned>(tensors.size()));
    for (unsigned i = 0; i < tensors.size(); ++i) {
      list[i].setName(tensors[i].name);
      list[i].setDtype(tensors[i].dtype);
      auto shape = list[i].initShape(static_cast<unsigned>(tensors[i].shape.size()));
      for (unsigned d = 0; d < tensors[i].shape.size(); ++d) shape.set(d, tensors[i].shape[d]);
    }
    hello.setTransport("inline");
    hello.setTransportRequired(true);
    hello.setBucketBytes(1 << 20);
    hello.setSlots(2);
    hello.setLendsTensors(lends_tensors);
    ch.send(m, session::deadline_in(5000ms), "hello");
  }

  // The next message, which must be a Refusal; returns its message.
  static std::string expect_refusal(session::Channel& ch, ferry_status_code_t code) {
    auto msg = ch.recv(session::deadline_in(10000ms), "refusal");
    EXPECT_EQ(msg->root().which(), wire::Message::REFUSAL);
    if (msg->root().which() != wire::Message::REFUSAL) return "";
    auto r = msg->root().getRefusal();
    EXPECT_EQ(r.getCode(), static_cast<std::uint32_t>(code)) << r.getMessage().cStr();
    return r.getMessage().cStr();
  }

  static std::unique_ptr<TwoVersions> versions_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TwoVersions> SessionBadInput::versions_;
std::unique_ptr<ServeProcess> SessionBadInput::serve_;

TEST_F(SessionBadInput, MismatchedLayoutIsRefusedNamingTheFirstDifferingTensor) {
  auto views = views_of(versions_->v2);
  const std::string changed = "model.layers.1.mlp.up_proj.weight";
  for (auto& v : views) {
    if (v.name == changed) v.shape = {v.shape[0] / 2, v.shape[1]};
  }
  config::Config config;
  registry::Registry registry({});
  session::SenderOptions options;
  options.receivers = {address_of(*serve_)};
  options.transport = "inline";
  session::Sender sender(config, registry, options);
  const auto report = sender.push(views, 2);
  ASSERT_EQ(report.receivers.size(), 1u);
  EXPECT_FALSE(report.receivers[0].committed);
  EXPECT_NE(report.receivers[0].error.find(changed), std::string::npos)
      << report.receivers[0].error;
  EXPECT_NE(report.receivers[0].error.find("refused"), std::string::npos)
      << report.receivers[0].error;
}

TEST_F(SessionBadInput, WrongProtocolVersionIsRefused) {
  auto ch = connect();
  send_hello(*ch, 99);
  const auto message = expect_refusal(*ch, FERRY_STATUS_INCOMPATIBLE);
  EXPECT_NE(message.find("protocol version 99"), std::string::npos) << message;
}

TEST_F(SessionBadInput, SenderClaimingAnotherProtocolVersionIsReportedRefused) {
  config::Config config;
  registry::Registry registry({});
  session::SenderOptions options;
  options.receivers = {address_of(*serve_)};
  options.transport = "inline";
  options.claimed_protocol_version = 99;
  session::Sender sender(config, registry, options);
  const auto report = sender.push(views_of(versions_->v2), 2);
  ASSERT_EQ(report.receivers.size(), 1u);
  EXPECT_FALSE(report.receivers[0].committed);
  EXPECT_EQ(report.receivers[0].code, FERRY_STATUS_INCOMPATIBLE) << report.receivers[0].error;
  EXPECT_NE(report.receivers[0].error.find("protocol version 99"), std::string::npos)
      << report.receivers[0].error;
  EXPECT_EQ(version_of(*serve_), 1);
}

TEST_F(SessionBadInput, GarbageOnTheSessionPortIsRefusedNamingThePeer) {
  const int fd = session::connect_tcp("127.0.0.1", session_port(), session::deadline_in(5000ms),
                                      "test");
  std::mt19937 rng(5);
  std::vector<unsigned char> garbage(4096);
  for (auto& b : garbage) b = static_cast<unsigned char>(rng());
  ASSERT_EQ(::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  // The receiver answers with a refusal frame (or just closes) and stays up.
  char reply[256];
  ::recv(fd, reply, sizeof reply, 0);
  ::close(fd);
  EXPECT_TRUE(eventually([] { return serve_->log().find("bad magic") != std::string::npos; }, 10))
      << serve_->log();
}

TEST_F(SessionBadInput, GarbageOnTheControlPortIsAnsweredWithoutHarm) {
  const int fd = session::connect_tcp("127.0.0.1", serve_->port(), session::deadline_in(5000ms),
                                      "test");
  const char garbage[] = "\x16\x03\x01\xff\xffNOT HTTP AT ALL\r\n\r\n";
  ASSERT_GT(::send(fd, garbage, sizeof garbage, MSG_NOSIGNAL), 0);
  char reply[256];
  ::recv(fd, reply, sizeof reply, 0);
  ::close(fd);
}

TEST_F(SessionBadInput, OversizeFrameIsRefusedBeforeReadingIt) {
  auto ch = connect();
  unsigned char header[16] = {'F', 'R', 'Y', '1', 1, 0, 0, 0};
  const std::uint64_t huge = 1ull << 40;
  for (int i = 0; i < 8; ++i) header[8 + i] = static_cast<unsigned char>(huge >> (8 * i));
  ASSERT_EQ(::send(ch->fd(), header, sizeof header, MSG_NOSIGNAL), 16);
  const auto message = expect_refusal(*ch, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(message.find("refused"), std::string::npos) << message;
}

TEST_F(SessionBadInput, ManifestThatLiesAboutTheBucketSizeIsRefused) {
  auto ch = connect();
  send_hello(*ch, wire::PROTOCOL_VERSION);
  auto welcome = ch->recv(session::deadline_in(10000ms), "welcome");
  ASSERT_EQ(welcome->root().which(), wire::Message::WELCOME);
  {
    capnp::MallocMessageBuilder m;
    auto b = m.initRoot<wire::Message>().initBegin();
    b.setVersion(5);
    b.setBucketCount(1);
    ch->send(m, session::deadline_in(5000ms), "begin");
    auto ready = ch->recv(session::deadline_in(10000ms), "ready");
    ASSERT_EQ(ready->root().which(), wire::Message::READY);
  }
  // A valid manifest of the first tensor (its real size), but the bucket announces and carries
  // only half of those bytes.
  const auto& t = versions_->v2.tensors.front();
  manifest::Manifest man;
  man.version = 5;
  man.bucket_index = 0;
  man.bucket_count = 1;
  man.bucket_bytes = t.bytes.size();
  man.tensors.push_back({t.name, t.dtype, t.shape, 0, t.bytes.size(), std::nullopt, std::nullopt,
                         std::nullopt});
  const auto manifest_bytes = manifest::encode(man);
  const std::uint64_t lie = t.bytes.size() / 2;
  capnp::MallocMessageBuilder m;
  auto br = m.initRoot<wire::Message>().initBucket();
  br.setIndex(0);
  br.setSlot(0);
  br.setBytes(lie);
  br.setManifest(kj::arrayPtr(manifest_bytes.data(), manifest_bytes.size()));
  br.setDataFollows(true);
  ch->send(m, session::deadline_in(5000ms), "bucket");
  ch->send_data(std::as_bytes(std::span(t.bytes.data(), lie)), session::deadline_in(5000ms),
                "bucket data");
  const auto message = expect_refusal(*ch, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(message.find("manifest says"), std::string::npos) << message;
}

// A sender that claims to lend its tensors to a receiver whose data path cannot map them (inline):
// the Welcome offers no reads in place, and a Begin announcing them anyway is refused before
// anything is read.
TEST_F(SessionBadInput, ReadsInPlaceThatWereNotOfferedAreRefused) {
  auto ch = connect();
  send_hello(*ch, wire::PROTOCOL_VERSION, true);
  auto welcome = ch->recv(session::deadline_in(10000ms), "welcome");
  ASSERT_EQ(welcome->root().which(), wire::Message::WELCOME);
  EXPECT_FALSE(welcome->root().getWelcome().getReadsTensors());
  capnp::MallocMessageBuilder m;
  auto b = m.initRoot<wire::Message>().initBegin();
  b.setVersion(5);
  b.setBucketCount(1);
  b.setReadsTensors(true);
  ch->send(m, session::deadline_in(5000ms), "begin");
  const auto message = expect_refusal(*ch, FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(message.find("reads in place announced, but none was offered"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace ferry::test
