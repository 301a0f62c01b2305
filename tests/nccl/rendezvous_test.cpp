// tests/nccl/rendezvous_test.cpp: the TCP rendezvous of a weight-update group over real sockets
// on 127.0.0.1: the id reaches every rank, a wrong version / garbage / wrong group is refused
// without stopping rank 0, a deadline names the missing rank or the phase, and a closed link
// names the rank that left; leaving together is agreed only when every rank leaves.
#include <arpa/inet.h>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "group/rendezvous.hpp"

namespace ferry::nccl {
namespace {

using namespace std::chrono_literals;

std::vector<std::uint8_t> test_id() {
  std::vector<std::uint8_t> id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(i * 7 + 3);
  return id;
}

GroupAddress address(std::uint16_t port, std::uint32_t world, std::string group = "g") {
  return GroupAddress{"127.0.0.1", port, std::move(group), world};
}

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no ferry::Error thrown";
  return Error(FERRY_STATUS_OK, "");
}

// A raw TCP connection to 127.0.0.1:port, for speaking the protocol by hand.
int connect_raw(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// A listening socket that never accepts (the kernel completes connects into its backlog).
int listen_raw(std::uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

void send_bytes(int fd, const std::vector<std::uint8_t>& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Everything the peer sends until it closes.
std::string read_all(int fd) {
  std::string out;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

TEST(Rendezvous, DeliversTheIdToEveryRank) {
  RendezvousServer server(address(0, 3), test_id());
  const auto port = server.port();
  ASSERT_NE(port, 0);
  auto join = [port](std::uint32_t rank) {
    RendezvousClient client;
    return client.join(address(port, 3), rank, Clock::now() + 20s);
  };
  auto r2 = std::async(std::launch::async, join, 2u);
  auto r1 = std::async(std::launch::async, join, 1u);
  server.serve(Clock::now() + 20s);
  EXPECT_EQ(r1.get(), test_id());
  EXPECT_EQ(r2.get(), test_id());
  EXPECT_TRUE(server.refusals().empty());
}

TEST(Rendezvous, JoinerRetriesUntilRankZeroListens) {
  std::uint16_t port = 0;
  ::close(listen_raw(&port));  // a free port, nobody listening yet
  auto joined = std::async(std::launch::async, [port] {
    RendezvousClient client;
    return client.join(address(port, 2), 1, Clock::now() + 20s);
  });
  std::this_thread::sleep_for(200ms);  // the joiner's first connects are refused
  RendezvousServer server(address(port, 2), test_id());
  server.serve(Clock::now() + 20s);
  EXPECT_EQ(joined.get(), test_id());
}

TEST(Rendezvous, RefusesAnotherVersionAndKeepsWaiting) {
  RendezvousServer server(address(0, 2), test_id());
  const auto port = server.port();
  auto served = std::async(std::launch::async, [&] { server.serve(Clock::now() + 20s); });
  // A HELLO of protocol version 2.
  std::vector<std::uint8_t> payload = {1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 'g'};
  int fd = connect_raw(port);
  send_bytes(fd, encode_frame(FrameType::hello, payload, 2));
  const std::string answer = read_all(fd);
  ::close(fd);
  ASSERT_GE(answer.size(), 12u);
  EXPECT_EQ(answer.substr(0, 4), "FRDV");
  EXPECT_EQ(static_cast<int>(answer[6]), static_cast<int>(FrameType::refuse));
  EXPECT_NE(answer.find("version 2 is not supported"), std::string::npos) << answer;
  // The real rank 1 still gets the id.
  RendezvousClient client;
  EXPECT_EQ(client.join(address(port, 2), 1, Clock::now() + 20s), test_id());
  served.get();
  ASSERT_EQ(server.refusals().size(), 1u);
}

TEST(Rendezvous, JoinerRefusesAnAnswerOfAnotherVersion) {
  std::uint16_t port = 0;
  int listener = listen_raw(&port);
  auto fake_root = std::async(std::launch::async, [listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    std::vector<std::uint8_t> hello(12 + 11);
    ::recv(fd, hello.data(), hello.size(), MSG_WAITALL);
    auto frame = encode_frame(FrameType::welcome, test_id(), 7);
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  RendezvousClient client;
  const Error e = error_of([&] { client.join(address(port, 2), 1, Clock::now() + 20s); });
  fake_root.get();
  ::close(listener);
  EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
  EXPECT_NE(std::string(e.what()).find("version 7"), std::string::npos) << e.what();
}

TEST(Rendezvous, DropsGarbageAndKeepsWaiting) {
  RendezvousServer server(address(0, 2), test_id());
  const auto port = server.port();
  auto served = std::async(std::launch::async, [&] { server.serve(Clock::now() + 20s); });
  int fd = connect_raw(port);
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  send_bytes(fd, std::vector<std::uint8_t>(http.begin(), http.end()));
  EXPECT_EQ(read_all(fd), "");  // closed without an answer
  ::close(fd);
  RendezvousClient client;
  EXPECT_EQ(client.join(address(port, 2), 1, Clock::now() + 20s), test_id());
  served.get();
  ASSERT_EQ(server.refusals().size(), 1u);
  EXPECT_NE(server.refusals()[0].find("bad magic"), std::string::npos) << server.refusals()[0];
}

TEST(Rendezvous, JoinerRefusesAnOversizedAnswer) {
  std::uint16_t port = 0;
  int listener = listen_raw(&port);
  auto fake_root = std::async(std::launch::async, [listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    // A WELCOME header announcing 1 GiB of id.
    std::vector<std::uint8_t> header = {'F', 'R', 'D', 'V', 1, 0, 2, 0, 0, 0, 0, 0x40};
    ::send(fd, header.data(), header.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    ::close(fd);
  });
  RendezvousClient client;
  const Error e = error_of([&] { client.join(address(port, 2), 1, Clock::now() + 20s); });
  fake_root.get();
  ::close(listener);
  EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(std::string(e.what()).find("1073741824"), std::string::npos) << e.what();
}

TEST(Rendezvous, RefusesAnotherGroupAWrongWorldSizeAndADuplicateRank) {
  RendezvousServer server(address(0, 3), test_id());
  const auto port = server.port();
  auto served = std::async(std::launch::async, [&] { server.serve(Clock::now() + 20s); });
  {
    RendezvousClient other;
    const Error e = error_of(
        [&] { other.join(address(port, 3, "other"), 1, Clock::now() + 20s); });
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_NE(std::string(e.what()).find("group 'other' is not the group 'g'"), std::string::npos)
        << e.what();
  }
  {
    RendezvousClient wrong_world;
    const Error e =
        error_of([&] { wrong_world.join(address(port, 4), 1, Clock::now() + 20s); });
    EXPECT_NE(std::string(e.what()).find("world_size 4"), std::string::npos) << e.what();
  }
  RendezvousClient first;
  EXPECT_EQ(first.join(address(port, 3), 1, Clock::now() + 20s), test_id());
  {
    RendezvousClient duplicate;
    const Error e = error_of([&] { duplicate.join(address(port, 3), 1, Clock::now() + 20s); });
    EXPECT_NE(std::string(e.what()).find("rank 1 of group 'g' joined already"),
              std::string::npos)
        << e.what();
  }
  RendezvousClient second;
  EXPECT_EQ(second.join(address(port, 3), 2, Clock::now() + 20s), test_id());
  served.get();
  EXPECT_EQ(server.refusals().size(), 3u);
}

TEST(Rendezvous, TimeoutNamesTheMissingRank) {
  RendezvousServer server(address(0, 4), test_id());
  const auto port = server.port();
  auto join = [port](std::uint32_t rank) {
    RendezvousClient client;
    client.join(address(port, 4), rank, Clock::now() + 20s);
  };
  auto r1 = std::async(std::launch::async, join, 1u);
  auto r3 = std::async(std::launch::async, join, 3u);
  // Rank 2 never comes. The deadline is generous so that ranks 1 and 3 surely joined.
  const Error e = error_of([&] { server.serve(Clock::now() + 3s); });
  r1.get();
  r3.get();
  EXPECT_EQ(e.code(), FERRY_STATUS_TIMEOUT);
  const std::string m = e.what();
  EXPECT_NE(m.find("rank 2 of world size 4 did not join"), std::string::npos) << m;
  EXPECT_NE(m.find("phase 'rendezvous'"), std::string::npos) << m;
}

TEST(Rendezvous, JoinerTimesOutNamingThePhaseWhenRankZeroIsDead) {
  std::uint16_t port = 0;
  ::close(listen_raw(&port));  // nobody listens there
  RendezvousClient client;
  const Error e = error_of([&] { client.join(address(port, 2), 1, Clock::now() + 500ms); });
  EXPECT_EQ(e.code(), FERRY_STATUS_TIMEOUT);
  const std::string m = e.what();
  EXPECT_NE(m.find("rank 1 of group 'g'"), std::string::npos) << m;
  EXPECT_NE(m.find("phase 'connect to rank 0'"), std::string::npos) << m;
}

TEST(Rendezvous, JoinerTimesOutNamingThePhaseWhenRankZeroNeverAnswers) {
  std::uint16_t port = 0;
  int listener = listen_raw(&port);  // accepts into the backlog, never answers
  RendezvousClient client;
  const Error e = error_of([&] { client.join(address(port, 2), 1, Clock::now() + 500ms); });
  ::close(listener);
  EXPECT_EQ(e.code(), FERRY_STATUS_TIMEOUT);
  EXPECT_NE(std::string(e.what()).find("phase 'await the id from rank 0'"), std::string::npos)
      << e.what();
}

TEST(Rendezvous, ClosedLinksNameTheRankThatLeft) {
  auto server = std::make_unique<RendezvousServer>(address(0, 3), test_id());
  const auto port = server->port();
  auto stay = std::make_unique<RendezvousClient>();
  auto leave = std::make_unique<RendezvousClient>();
  auto j1 = std::async(std::launch::async,
                       [&] { stay->join(address(port, 3), 1, Clock::now() + 20s); });
  auto j2 = std::async(std::launch::async,
                       [&] { leave->join(address(port, 3), 2, Clock::now() + 20s); });
  server->serve(Clock::now() + 20s);
  j1.get();
  j2.get();
  EXPECT_TRUE(server->dead_ranks().empty());
  leave.reset();
  // The close travels through the loopback; wait for it without a timed assertion.
  std::vector<std::uint32_t> dead;
  for (int i = 0; i < 500 && dead.empty(); ++i) {
    dead = server->dead_ranks();
    if (dead.empty()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(dead, std::vector<std::uint32_t>{2});
  EXPECT_TRUE(stay->root_alive());
  server.reset();
  bool alive = true;
  for (int i = 0; i < 500 && alive; ++i) {
    alive = stay->root_alive();
    if (alive) std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(alive);
}

TEST(Rendezvous, ShuttingLinksDownTellsTheOtherSide) {
  RendezvousServer server(address(0, 3), test_id());
  const auto port = server.port();
  RendezvousClient one, two;
  auto j1 = std::async(std::launch::async,
                       [&] { one.join(address(port, 3), 1, Clock::now() + 20s); });
  auto j2 = std::async(std::launch::async,
                       [&] { two.join(address(port, 3), 2, Clock::now() + 20s); });
  server.serve(Clock::now() + 20s);
  j1.get();
  j2.get();
  // A joiner that gives up (its process lives on) is named by rank 0.
  one.shutdown_link();
  std::vector<std::uint32_t> dead;
  for (int i = 0; i < 500 && dead.empty(); ++i) {
    dead = server.dead_ranks();
    if (dead.empty()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(dead, std::vector<std::uint32_t>{1});
  // Rank 0 giving up is seen by the remaining joiner.
  EXPECT_TRUE(two.root_alive());
  server.shutdown_links();
  bool alive = true;
  for (int i = 0; i < 500 && alive; ++i) {
    alive = two.root_alive();
    if (alive) std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(alive);
}

// A served group of rank 0 and two joiners.
struct JoinedGroup {
  RendezvousServer server{address(0, 3), test_id()};
  RendezvousClient one, two;
  JoinedGroup() {
    const auto port = server.port();
    auto j1 = std::async(std::launch::async,
                         [&] { one.join(address(port, 3), 1, Clock::now() + 20s); });
    auto j2 = std::async(std::launch::async,
                         [&] { two.join(address(port, 3), 2, Clock::now() + 20s); });
    server.serve(Clock::now() + 20s);
    j1.get();
    j2.get();
  }
};

TEST(Rendezvous, EveryRankLeavingTogetherAgreesToFinalize) {
  JoinedGroup g;
  auto l1 = std::async(std::launch::async, [&] { return g.one.leave_together(Clock::now() + 20s); });
  auto l2 = std::async(std::launch::async, [&] { return g.two.leave_together(Clock::now() + 20s); });
  EXPECT_TRUE(g.server.leave_together(Clock::now() + 20s));
  EXPECT_TRUE(l1.get());
  EXPECT_TRUE(l2.get());
  g.server.announce_leave(true);
  g.one.announce_leave(true);
  g.two.announce_leave(true);
}

TEST(Rendezvous, AOneSidedLeaveAbortsAndTheOthersLearnIt) {
  JoinedGroup g;
  // Rank 1 leaves alone: nobody else is leaving, so its window ends without agreement.
  EXPECT_FALSE(g.one.leave_together(Clock::now() + 200ms));
  g.one.announce_leave(false);
  // Rank 0, still in the group, names rank 1 (its leave bytes count as leaving).
  std::vector<std::uint32_t> dead;
  for (int i = 0; i < 500 && dead.empty(); ++i) {
    dead = g.server.dead_ranks();
    if (dead.empty()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(dead, std::vector<std::uint32_t>{1});
  // When rank 0 and rank 2 leave later, rank 1's 'A' makes rank 0 abort too, and rank 2 (which
  // hears only rank 0) is told so.
  auto l2 = std::async(std::launch::async, [&] { return g.two.leave_together(Clock::now() + 20s); });
  const bool together = g.server.leave_together(Clock::now() + 20s);
  EXPECT_FALSE(together);
  g.server.announce_leave(together);
  EXPECT_FALSE(l2.get());
}

TEST(Rendezvous, ARankThatDiedIsNeverLeftTogetherWith) {
  JoinedGroup g;
  g.two.shutdown_link();  // as if its process had died
  auto l1 = std::async(std::launch::async, [&] { return g.one.leave_together(Clock::now() + 20s); });
  const bool together = g.server.leave_together(Clock::now() + 20s);
  EXPECT_FALSE(together);
  g.server.announce_leave(together);
  EXPECT_FALSE(l1.get());
}

// A rank 0 spoken by hand: accepts one joiner, answers its HELLO with the id, then sends
// `after` (leave bytes) and shuts its sending side, all before the joiner starts leaving.
bool joiner_leaves_together_after(const std::string& after) {
  std::uint16_t port = 0;
  const int listener = listen_raw(&port);
  RendezvousClient client;
  auto joined = std::async(std::launch::async,
                           [&] { return client.join(address(port, 2), 1, Clock::now() + 20s); });
  const int fd = ::accept(listener, nullptr, nullptr);
  char hello[512];
  EXPECT_GT(::recv(fd, hello, sizeof hello, 0), 0);  // HELLO: one small frame
  send_bytes(fd, encode_frame(FrameType::welcome, test_id()));
  EXPECT_EQ(joined.get(), test_id());
  send_bytes(fd, std::vector<std::uint8_t>(after.begin(), after.end()));
  ::shutdown(fd, SHUT_WR);
  const bool together = client.leave_together(Clock::now() + 20s);
  ::close(fd);
  ::close(listener);
  return together;
}

TEST(Rendezvous, AJoinerReadsRankZerosAgreementEvenAfterItsSendingSideClosed) {
  // Rank 0 agreed ('L'), decided to finalize ('F') and shut its side before the joiner read.
  EXPECT_TRUE(joiner_leaves_together_after("LF"));
  // Rank 0 gave up, or closed without agreeing.
  EXPECT_FALSE(joiner_leaves_together_after("A"));
  EXPECT_FALSE(joiner_leaves_together_after("LA"));
  EXPECT_FALSE(joiner_leaves_together_after(""));
}

TEST(Rendezvous, DescribesRanks) {
  EXPECT_EQ(describe_ranks({1}), "rank 1");
  EXPECT_EQ(describe_ranks({2, 3}), "ranks 2, 3");
}

}  // namespace
}  // namespace ferry::nccl
