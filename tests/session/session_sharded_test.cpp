// tests/session/session_sharded_test.cpp: sharded pushes into real `ferry serve` processes
// (docs/sharded.md): a checkpoint split over 2 and 4 `ferry push --rank R --world S` processes
// (dim-0 row ranges and whole tensors per rank) lands bit-identical to the unsharded push; in-
// process senders with explicit blocks (column blocks, replicas); a rank killed mid-push, a rank
// that stalls past the deadline or never joins, blocks that overlap or leave a gap, and ranks
// that disagree on the version or a tensor's shape abort the update, naming the rank and the
// tensor, and the receiver keeps its previous version.
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/manifest.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/channel.hpp"
#include "session_fixture.hpp"
#include "../moe/moe_checkpoint.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
namespace wire = session::wire;

class SessionSharded : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }

  // `world` `ferry push --rank r` processes of v2 into `to`, run side by side; their results.
  static std::vector<ChildResult> push_ranks(const std::string& to, unsigned world,
                                             const std::string& shard_by,
                                             const std::string& transport = "inline",
                                             std::map<unsigned, std::vector<std::string>> extra = {},
                                             double others_deadline_s = 60) {
    std::vector<std::unique_ptr<PushProcess>> pushes;
    for (unsigned r = 0; r < world; ++r) {
      std::vector<std::string> args = {"--log-level", "warn", "push", "--to", to,
                                       "--transport", transport, "--model-path",
                                       versions_->v2_path(), "--version", "2",
                                       "--bucket-bytes", "512", "--no-progress",
                                       "--rank", std::to_string(r), "--world",
                                       std::to_string(world), "--shard-by", shard_by,
                                       "--bucket-timeout-ms", "5000", "--commit-timeout-ms",
                                       "5000"};
      for (const auto& a : extra[r]) args.push_back(a);
      pushes.push_back(std::make_unique<PushProcess>(args, std::map<std::string, std::string>{}));
    }
    std::vector<ChildResult> results(world);
    for (unsigned r = 0; r < world; ++r) {
      // Rank 0 first; a rank made to stall is killed once rank 0 has its answer.
      if (!pushes[r]->wait(r == 0 ? 60 : others_deadline_s, results[r])) pushes[r]->kill_now();
    }
    return results;
  }

  // The fingerprints of a receiver that got v2 from one unsharded `ferry push`.
  static std::map<std::string, std::string> unsharded_v2(unsigned tp_rank = 0,
                                                         unsigned tp_size = 1) {
    ServeProcess serve(receiver_options(versions_->v1_path(), tp_rank, tp_size));
    const auto push = run_ferry({"--log-level", "warn", "push", "--to", address_of(serve),
                                 "--transport", "inline", "--model-path", versions_->v2_path(),
                                 "--version", "2", "--bucket-bytes", "512", "--no-progress"});
    EXPECT_TRUE(push.exited && push.status == 0) << push.output;
    EXPECT_EQ(version_of(serve), 2);
    return serve.fingerprints();
  }

  static void expect_unchanged(const ServeProcess& serve) {
    EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20))
        << serve.get("/health").text << serve.log();
    EXPECT_EQ(version_of(serve), 1);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  }

  // Four `ferry push --rank` processes into two tensor-parallel receivers (below).
  static void four_ranks_into_two_tensor_parallel_receivers(const std::string& transport,
                                                            const std::string& shard_by = "dim0");

  static std::unique_ptr<TwoVersions> versions_;
};
std::unique_ptr<TwoVersions> SessionSharded::versions_;

// One in-process rank: its views (blocks), pushed to `to` as `version`.
struct Rank {
  std::vector<session::TensorView> views;
  std::vector<std::vector<std::uint8_t>> copies;  // contiguous copies of strided blocks
  session::PushReport report;
};

// The block of rows [begin, end) of a tensor (contiguous in place).
session::TensorView rows_of(const Tensor& t, std::uint64_t begin, std::uint64_t end) {
  std::uint64_t row_bytes = t.bytes.size() / t.shape[0];
  session::TensorView v{t.name, t.dtype, t.shape, t.bytes.data() + begin * row_bytes,
                        FERRY_MEMORY_HOST, 0};
  v.global_shape = t.shape;
  v.offsets.assign(t.shape.size(), 0);
  v.offsets[0] = begin;
  v.shape[0] = end - begin;
  return v;
}

// The block of columns [begin, end) of a 2-D tensor, copied into `rank.copies`.
session::TensorView cols_of(Rank& rank, const Tensor& t, std::uint64_t begin, std::uint64_t end) {
  const std::uint64_t rows = t.shape[0], cols = t.shape[1];
  const std::uint64_t elem = t.bytes.size() / (rows * cols);
  auto& copy = rank.copies.emplace_back((end - begin) * rows * elem);
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::memcpy(copy.data() + r * (end - begin) * elem, t.bytes.data() + (r * cols + begin) * elem,
                (end - begin) * elem);
  }
  session::TensorView v{t.name, t.dtype, {rows, end - begin}, copy.data(), FERRY_MEMORY_HOST, 0};
  v.global_shape = t.shape;
  v.offsets = {0, begin};
  return v;
}

session::TensorView whole(const Tensor& t, bool replica = false) {
  session::TensorView v{t.name, t.dtype, t.shape, t.bytes.data(), FERRY_MEMORY_HOST, 0};
  v.global_shape = t.shape;
  v.replica = replica;
  return v;
}

// The options of in-process rank `r` of `world` pushing to `to` inline in 512-byte buckets.
session::SenderOptions rank_options(const std::string& to, std::uint32_t r,
                                    std::uint32_t world = 2) {
  session::SenderOptions o;
  for (std::size_t at = 0; at <= to.size();) {  // "A,B": several receivers
    const auto comma = std::min(to.find(',', at), to.size());
    o.receivers.push_back(to.substr(at, comma - at));
    at = comma + 1;
  }
  o.transport = "inline";
  o.bucket_bytes = 512;
  o.bucket_timeout = std::chrono::milliseconds(5000);
  o.commit_timeout = std::chrono::milliseconds(5000);
  o.shard_rank = r;
  o.shard_world = world;
  return o;
}

// Pushes every rank of `ranks` (rank r: ranks[r]) side by side, each as version versions[r].
void push_in_process(std::vector<Rank>& ranks, const std::string& to,
                     std::vector<std::uint64_t> versions = {}) {
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      config::Config config;
      registry::Registry registry({});
      session::Sender sender(config, registry,
                             rank_options(to, static_cast<std::uint32_t>(r),
                                          static_cast<std::uint32_t>(ranks.size())));
      ranks[r].report = sender.push(ranks[r].views, versions.empty() ? 2 : versions[r]);
    });
  }
  for (auto& t : threads) t.join();
}

std::string all_output(const std::vector<ChildResult>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r) {
    out += fmt::format("--- rank {} ({}, {}):\n{}\n", r, results[r].exited ? "exit" : "signal",
                       results[r].status, results[r].output);
  }
  return out;
}

// A rank's report for receiver `to` (`ferry push`'s line "receiver TO: sharded update of ...,
// M moved, N needed"): (M, N); (0, 0) when it has none.
std::pair<std::uint64_t, std::uint64_t> moved_and_needed(const std::string& output,
                                                         const std::string& to) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("receiver " + to + ": sharded update") == std::string::npos) continue;
    const auto moved_at = line.rfind(" moved, ");
    const auto start = line.rfind(' ', moved_at - 1);
    const auto needed_at = line.find(" needed", moved_at);
    if (moved_at == std::string::npos || start == std::string::npos) break;
    return {std::stoull(line.substr(start + 1, moved_at - start - 1)),
            std::stoull(line.substr(moved_at + 8, needed_at - moved_at - 8))};
  }
  return {0, 0};
}

TEST_F(SessionSharded, DimZeroSplitOverTwoPushProcessesIsBitIdenticalToTheUnshardedPush) {
  const auto reference = unsharded_v2();
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto results = push_ranks(address_of(serve), 2, "dim0");
  for (const auto& r : results) ASSERT_TRUE(r.exited && r.status == 0) << all_output(results);
  EXPECT_EQ(version_of(serve), 2);
  EXPECT_EQ(serve.fingerprints(), reference);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  // The report: bytes moved per rank, all of them once: the bytes needed.
  const std::string needed = std::to_string(versions_->v2.total_bytes());
  EXPECT_NE(results[0].output.find(needed + " moved, " + needed + " needed"), std::string::npos)
      << results[0].output;
}

TEST_F(SessionSharded, TensorSplitOverFourPushProcessesIsBitIdenticalToTheUnshardedPush) {
  const auto reference = unsharded_v2();
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto results = push_ranks(address_of(serve), 4, "tensor");
  for (const auto& r : results) ASSERT_TRUE(r.exited && r.status == 0) << all_output(results);
  EXPECT_EQ(version_of(serve), 2);
  EXPECT_EQ(serve.fingerprints(), reference);
}

// Four `ferry push --rank` processes (`--shard-by shard_by`) into two tensor-parallel receivers over
// `transport`.
void SessionSharded::four_ranks_into_two_tensor_parallel_receivers(const std::string& transport,
                                                                   const std::string& shard_by) {
  ServeProcess a(receiver_options(versions_->v1_path(), 0, 2));
  ServeProcess b(receiver_options(versions_->v1_path(), 1, 2));
  const auto results = push_ranks(address_of(a) + "," + address_of(b), 4, shard_by, transport);
  for (const auto& r : results) ASSERT_TRUE(r.exited && r.status == 0) << all_output(results);
  EXPECT_EQ(version_of(a), 2);
  EXPECT_EQ(version_of(b), 2);
  EXPECT_EQ(a.fingerprints(), expected_fingerprints(versions_->v2, 0, 2));
  EXPECT_EQ(b.fingerprints(), expected_fingerprints(versions_->v2, 1, 2));
  // Each receiver got only what its plan reads (the rows of what it splits by rows, the columns
  // of what it splits by columns): exactly its parameters' bytes, no tensor whole.
  const std::uint64_t total = versions_->v2.total_bytes();
  std::uint64_t both = 0;
  for (unsigned tp = 0; tp < 2; ++tp) {
    const std::string to = address_of(tp == 0 ? a : b);
    std::uint64_t params = 0;
    for (const auto& [name, bytes] : dense_expected_params(versions_->v2, "engine", tp, 2)) {
      params += bytes.size();
    }
    const auto [moved, needed] = moved_and_needed(results[0].output, to);
    EXPECT_EQ(needed, params) << results[0].output;
    EXPECT_EQ(moved, needed) << results[0].output;
    EXPECT_LT(moved, total) << results[0].output;
    both += moved;
  }
  EXPECT_LT(both, 2 * total);
}

TEST_F(SessionSharded, DimZeroSplitOverFourPushProcessesIntoTwoTensorParallelReceivers) {
  four_ranks_into_two_tensor_parallel_receivers("inline");
}

// Whole tensors dealt out to four ranks: each receiver still takes only its rows and columns.
TEST_F(SessionSharded, TensorSplitOverFourPushProcessesIntoTwoTensorParallelReceivers) {
  four_ranks_into_two_tensor_parallel_receivers("inline", "tensor");
}

TEST_F(SessionSharded, DimZeroSplitOverFourPushProcessesIntoTwoTensorParallelReceiversOverUcx) {
  if (std::getenv("FERRY_TEST_HAVE_UCX") == nullptr) GTEST_SKIP() << "the ucx plugin is not built";
  four_ranks_into_two_tensor_parallel_receivers("ucx");
}

TEST_F(SessionSharded, DimZeroSplitOverUcx) {
  if (std::getenv("FERRY_TEST_HAVE_UCX") == nullptr) GTEST_SKIP() << "the ucx plugin is not built";
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto results = push_ranks(address_of(serve), 2, "dim0", "ucx");
  for (const auto& r : results) {
    ASSERT_TRUE(r.exited && r.status == 0) << all_output(results);
    EXPECT_NE(r.output.find("via ucx"), std::string::npos) << r.output;
  }
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
}

// The ranks of `checkpoint` split in two as a trainer's FSDP ranks hold it: rows of every tensor
// of at least 2 rows, smaller ones whole on rank 0 and a replica on rank 1.
std::vector<Rank> dim0_ranks(const Checkpoint& checkpoint) {
  std::vector<Rank> ranks(2);
  for (const auto& t : checkpoint.tensors) {
    if (!t.shape.empty() && t.shape[0] >= 2) {
      ranks[0].views.push_back(rows_of(t, 0, t.shape[0] / 2));
      ranks[1].views.push_back(rows_of(t, t.shape[0] / 2, t.shape[0]));
    } else {
      ranks[0].views.push_back(whole(t));
      ranks[1].views.push_back(whole(t, true));
    }
  }
  return ranks;
}

// Kept sessions across sharded updates: each rank's Sender (one per rank, as in a trainer) pushes
// versions 2 .. 4, the later ones through the sessions kept from the first (no new handshake),
// bit-identical, each later update taking the plan of the one before over (the ranks rejoin with
// the holdings of their Hellos). A release of the receiver's memory suspends the kept sharded
// sessions (the colocated loop releases before every training step); the pushes after each
// resume rejoin them, still with no new handshake, and commit bit-identical.
TEST_F(SessionSharded, KeptSessionsCarryTheNextUpdatesAndSurviveARelease) {
  auto options = receiver_options(versions_->v1_path());
  options.log_level = "debug";
  ServeProcess serve(options);
  config::Config config;
  registry::Registry registry({});
  std::vector<std::unique_ptr<session::Sender>> senders;
  for (std::uint32_t r = 0; r < 2; ++r) {
    senders.push_back(
        std::make_unique<session::Sender>(config, registry, rank_options(address_of(serve), r)));
  }
  const auto push_both = [&](const Checkpoint& checkpoint, std::uint64_t version) {
    auto ranks = dim0_ranks(checkpoint);
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] { ranks[r].report = senders[r]->push(ranks[r].views, version); });
    }
    for (auto& t : threads) t.join();
    std::vector<session::ReceiverResult> out;
    for (const auto& rank : ranks) out.push_back(rank.report.receivers.at(0));
    return out;
  };
  const Checkpoint* values[] = {&versions_->v2, &versions_->v1, &versions_->v2};
  for (std::uint64_t version = 2; version <= 4; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    for (const auto& r : push_both(*values[version - 2], version)) {
      ASSERT_TRUE(r.committed) << r.error;
      EXPECT_EQ(r.reused_session, version > 2);
    }
    EXPECT_EQ(version_of(serve), static_cast<long long>(version));
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(*values[version - 2], 0, 1));
  }
  std::string log = serve.log();
  EXPECT_EQ(count_of(log, "layout accepted"), 2u) << log;  // one handshake per rank
  EXPECT_EQ(count_of(log, "(the update before's plan)"), 2u) << log;  // versions 3 and 4

  for (std::uint64_t version = 5; version <= 6; ++version) {
    SCOPED_TRACE(fmt::format("version {} after a release and a resume", version));
    const auto suspended_before = count_of(serve.log(), "2 kept session(s) suspended and 0 closed");
    const Reply release = serve.post("/release_memory_occupation", nlohmann::json::object(),
                                     serve.auth());
    ASSERT_EQ(release.status, 200) << release.text;
    log = serve.log();
    EXPECT_EQ(count_of(log, "2 kept session(s) suspended and 0 closed"), suspended_before + 1)
        << log;
    const Reply resume = serve.post("/resume_memory_occupation", nlohmann::json::object(),
                                    serve.auth());
    ASSERT_EQ(resume.status, 200) << resume.text;
    const Checkpoint& value = version == 5 ? versions_->v1 : versions_->v2;
    for (const auto& r : push_both(value, version)) {
      ASSERT_TRUE(r.committed) << r.error;
      EXPECT_TRUE(r.reused_session);
    }
    EXPECT_EQ(version_of(serve), static_cast<long long>(version));
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(value, 0, 1));
  }
  log = serve.log();
  EXPECT_EQ(count_of(log, "layout accepted"), 2u) << log;  // still one handshake per rank
  EXPECT_EQ(count_of(log, "rejoined after the release"), 4u) << log;  // 2 ranks, 2 releases
}

// update.delivery = "direct" on the ranks where the receiver cannot offer it (inline: no
// device memory written remotely): each rank fails naming direct delivery, nothing changes.
TEST_F(SessionSharded, RequiredDirectDeliveryWithoutAnOfferFailsClearly) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  auto ranks = dim0_ranks(versions_->v2);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      config::Config config;
      config.update.delivery = config::Delivery::direct;
      registry::Registry registry({});
      session::Sender sender(config, registry, rank_options(address_of(serve), r));
      ranks[r].report = sender.push(ranks[r].views, 2);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& rank : ranks) {
    const auto& r = rank.report.receivers.at(0);
    EXPECT_FALSE(r.committed);
    EXPECT_NE(r.error.find("direct"), std::string::npos) << r.error;
  }
  expect_unchanged(serve);
}

TEST_F(SessionSharded, RankKilledMidPushLeavesThePreviousVersionAndTheErrorNamesTheRank) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  const auto results =
      push_ranks(address_of(serve), 2, "dim0", "inline", {{1, {"--test-exit-after-bucket", "1"}}});
  EXPECT_FALSE(results[1].exited) << all_output(results);  // killed itself
  EXPECT_TRUE(results[0].exited && results[0].status == 1) << all_output(results);
  EXPECT_NE(results[0].output.find("rank 1"), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("keeps version 1"), std::string::npos) << results[0].output;
  expect_unchanged(serve);
  // The next sharded push of the same version commits.
  const auto again = push_ranks(address_of(serve), 2, "dim0");
  for (const auto& r : again) ASSERT_TRUE(r.exited && r.status == 0) << all_output(again);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
}

TEST_F(SessionSharded, ARankThatStallsPastTheDeadlineAbortsTheUpdateNamingIt) {
  ServeProcess serve(receiver_options(versions_->v1_path()));  // 3 s bucket deadline
  const auto results = push_ranks(address_of(serve), 2, "dim0", "inline",
                                  {{1, {"--test-stall-after-bucket", "1"}}}, 2);
  EXPECT_TRUE(results[0].exited && results[0].status == 1) << all_output(results);
  EXPECT_NE(results[0].output.find("rank 1"), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("deadline"), std::string::npos) << results[0].output;
  expect_unchanged(serve);
}

TEST_F(SessionSharded, ARankThatNeverJoinsAbortsTheUpdateNamingIt) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(1);
  for (const auto& t : versions_->v2.tensors) ranks[0].views.push_back(whole(t));
  // Rank 0 of a world of 2; rank 1 never comes.
  config::Config config;
  registry::Registry registry({});
  session::SenderOptions options;
  options.receivers = {address_of(serve)};
  options.transport = "inline";
  options.connect_timeout = std::chrono::milliseconds(20000);
  session::Sender sender(config, registry, options);
  const auto report = sender.push(ranks[0].views, 2, std::nullopt, {}, session::ShardSpec{0, 2});
  ASSERT_FALSE(report.all_committed());
  EXPECT_NE(report.receivers[0].error.find("rank(s) 1 did not join"), std::string::npos)
      << report.receivers[0].error;
  expect_unchanged(serve);
}

TEST_F(SessionSharded, RanksThatDisagreeOnATensorsShapeAbortTheUpdate) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  const Tensor& norm = versions_->v2.at("model.norm.weight");
  for (const auto& t : versions_->v2.tensors) ranks[0].views.push_back(whole(t));
  session::TensorView other = whole(norm, /*replica=*/true);
  other.global_shape = {16};
  ranks[1].views.push_back(other);
  push_in_process(ranks, address_of(serve));
  for (const auto& r : ranks) {
    ASSERT_FALSE(r.report.all_committed());
    const std::string& error = r.report.receivers[0].error;
    EXPECT_NE(error.find("ranks 0 and 1 disagree on tensor 'model.norm.weight': F32 [8] against "
                         "F32 [16]"),
              std::string::npos)
        << error;
  }
  expect_unchanged(serve);
}

TEST_F(SessionSharded, ColumnBlocksAndReplicasFromInProcessSenders) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  std::uint64_t rank0_bytes = 0, rank1_bytes = 0;
  for (const auto& t : versions_->v2.tensors) {
    if (t.shape.size() == 2) {
      // Column blocks: strided in the global tensor.
      const std::uint64_t half = t.shape[1] / 2;
      ranks[0].views.push_back(cols_of(ranks[0], t, 0, half));
      ranks[1].views.push_back(cols_of(ranks[1], t, half, t.shape[1]));
      rank0_bytes += t.bytes.size() * half / t.shape[1];
      rank1_bytes += t.bytes.size() - t.bytes.size() * half / t.shape[1];
    } else {
      // Replicated: both hold it, rank 0 (the lowest) sends it.
      ranks[0].views.push_back(whole(t));
      ranks[1].views.push_back(whole(t, /*replica=*/true));
      rank0_bytes += t.bytes.size();
    }
  }
  push_in_process(ranks, address_of(serve));
  for (const auto& r : ranks) {
    ASSERT_TRUE(r.report.all_committed()) << r.report.receivers[0].error;
  }
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  const auto& result = ranks[1].report.receivers[0];
  ASSERT_EQ(result.rank_bytes.size(), 2u);
  EXPECT_EQ(result.rank_bytes[0], rank0_bytes);
  EXPECT_EQ(result.rank_bytes[1], rank1_bytes);  // replicas were not sent
  EXPECT_EQ(result.needed_bytes, versions_->v2.total_bytes());
  EXPECT_EQ(result.rank_bytes[0] + result.rank_bytes[1], result.needed_bytes);
}

// A Megatron-style trainer of tensor-parallel size 2 (column-parallel weights split by rows,
// row-parallel ones by columns, norms replicated) into an engine of tensor-parallel size 2: each
// receiver takes exactly its parameters' bytes, its own slices from its own rank and the
// replicated norms from rank 0, nothing from the other rank.
TEST_F(SessionSharded, MegatronSlicesIntoTwoTensorParallelReceiversMoveOnlyWhatEachNeeds) {
  ServeProcess a(receiver_options(versions_->v1_path(), 0, 2));
  ServeProcess b(receiver_options(versions_->v1_path(), 1, 2));
  std::vector<Rank> ranks(2);
  std::uint64_t replicated = 0;
  for (const auto& t : versions_->v2.tensors) {
    const int dim = dense_shard_dim(t.name);
    for (unsigned r = 0; r < 2; ++r) {
      if (dim < 0) {
        ranks[r].views.push_back(whole(t, /*replica=*/r == 1));
      } else {
        const std::uint64_t n = t.shape[dim] / 2;
        ranks[r].views.push_back(dim == 0 ? rows_of(t, r * n, (r + 1) * n)
                                          : cols_of(ranks[r], t, r * n, (r + 1) * n));
      }
    }
    if (dim < 0) replicated += t.bytes.size();
  }
  push_in_process(ranks, address_of(a) + "," + address_of(b));
  for (const auto& r : ranks) {
    for (const auto& result : r.report.receivers) ASSERT_TRUE(result.committed) << result.error;
  }
  EXPECT_EQ(a.fingerprints(), expected_fingerprints(versions_->v2, 0, 2));
  EXPECT_EQ(b.fingerprints(), expected_fingerprints(versions_->v2, 1, 2));
  for (unsigned tp = 0; tp < 2; ++tp) {
    std::uint64_t params = 0;
    for (const auto& [name, bytes] : dense_expected_params(versions_->v2, "engine", tp, 2)) {
      params += bytes.size();
    }
    const auto& result = ranks[0].report.receivers[tp];
    ASSERT_EQ(result.rank_bytes.size(), 2u);
    EXPECT_EQ(result.needed_bytes, params);
    EXPECT_EQ(result.rank_bytes[0] + result.rank_bytes[1], params);
    // The other rank's slices are none of this receiver's: only the norms cross over.
    EXPECT_EQ(result.rank_bytes[1 - tp], tp == 0 ? 0u : replicated);
  }
}

// One trainer holding every tensor whole into an engine of tensor-parallel size 2: each
// receiver's Welcome says its plan reads only parts of the tensors, so after the first push
// (whole tensors, inline) the Sender pushes as rank 0 of a 1-rank sharded update: each receiver
// is sent exactly its parameters' bytes, and both equal a disk load of their tp_rank.
TEST_F(SessionSharded, AWholeTrainerSendsTensorParallelReceiversOnlyTheirPartsFromItsSecondPush) {
  ServeProcess a(receiver_options(versions_->v1_path(), 0, 2));
  ServeProcess b(receiver_options(versions_->v1_path(), 1, 2));
  std::vector<session::TensorView> views;
  for (const auto& t : versions_->v2.tensors) {
    views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), FERRY_MEMORY_HOST, 0});
  }
  config::Config config;
  registry::Registry registry({});
  session::Sender sender(config, registry,
                         rank_options(address_of(a) + "," + address_of(b), 0, /*world=*/0));
  const auto first = sender.push(views, 2);
  for (const auto& result : first.receivers) {
    ASSERT_TRUE(result.committed) << result.error;
    EXPECT_TRUE(result.takes_pieces) << result.address;
    EXPECT_TRUE(result.rank_bytes.empty()) << "the first push sends whole tensors";
  }
  for (std::uint64_t version = 3; version <= 4; ++version) {
    const auto report = sender.push(views, version);
    for (unsigned tp = 0; tp < 2; ++tp) {
      const auto& result = report.receivers[tp];
      ASSERT_TRUE(result.committed) << result.error;
      std::uint64_t params = 0;
      for (const auto& [name, bytes] : dense_expected_params(versions_->v2, "engine", tp, 2)) {
        params += bytes.size();
      }
      EXPECT_EQ(result.rank_bytes, std::vector<std::uint64_t>{params}) << "version " << version;
      EXPECT_EQ(result.needed_bytes, params);
      EXPECT_EQ(result.reused_session, version == 4) << "the switch opens new sessions, once";
    }
    EXPECT_EQ(a.fingerprints(), expected_fingerprints(versions_->v2, 0, 2));
    EXPECT_EQ(b.fingerprints(), expected_fingerprints(versions_->v2, 1, 2));
  }
}

// Experts spread over two ranks (expert e on rank e % 2; everything else sent by rank 0, a
// replica on rank 1) into an engine of expert-parallel size 2: each receiver equals a disk load
// of the checkpoint with its ep_rank and takes only its own experts (and the rest), once.
TEST_F(SessionSharded, ExpertsSpreadOverRanksIntoTwoExpertParallelReceivers) {
  moe_test::MoeShape shape;
  const auto v1 = moe_test::make_moe_checkpoint(shape, 5);
  const auto v2 = moe_test::make_moe_checkpoint(shape, 6);
  TempDir dir;
  moe_test::write_moe_checkpoint(dir.path() / "v1", shape, v1);
  moe_test::write_moe_checkpoint(dir.path() / "v2", shape, v2);
  const auto moe_options = [&](const std::string& version, unsigned ep_rank) {
    ServeOptions o = receiver_options((dir.path() / version).string());
    o.model_family = "moe";
    o.sets = {"receiver.ep_size=2", fmt::format("receiver.ep_rank={}", ep_rank)};
    return o;
  };
  ServeProcess a(moe_options("v1", 0));
  ServeProcess b(moe_options("v1", 1));
  std::vector<Rank> ranks(2);
  std::uint64_t total = 0;
  for (const auto& [name, t] : v2) {
    const auto expert = name.find(".experts.");
    const unsigned holder =
        expert == std::string::npos ? 0 : std::stoul(name.substr(expert + 9)) % 2;
    for (unsigned r = 0; r < 2; ++r) {
      if (expert != std::string::npos && r != holder) continue;
      session::TensorView v{t.name, FERRY_DTYPE_BF16, t.shape, t.bf16.data(), FERRY_MEMORY_HOST,
                            0};
      v.global_shape = t.shape;
      v.replica = r != holder;
      ranks[r].views.push_back(v);
    }
    total += t.bf16.size() * 2;
  }
  push_in_process(ranks, address_of(a) + "," + address_of(b));
  for (const auto& r : ranks) {
    for (const auto& result : r.report.receivers) ASSERT_TRUE(result.committed) << result.error;
  }
  for (unsigned ep = 0; ep < 2; ++ep) {
    ServeProcess reference(moe_options("v2", ep));
    EXPECT_EQ((ep == 0 ? a : b).fingerprints(), reference.fingerprints()) << "ep_rank " << ep;
    const auto& result = ranks[0].report.receivers[ep];
    ASSERT_EQ(result.rank_bytes.size(), 2u);
    EXPECT_EQ(result.rank_bytes[0] + result.rank_bytes[1], result.needed_bytes);
    EXPECT_LT(result.needed_bytes, total);  // the other receiver's experts are not moved here
  }
}

// A rank that sends a whole block where the receiver's Welcome asked for part of it (a hostile
// or broken sender) is refused naming the tensor, and the receiver keeps its version.
TEST_F(SessionSharded, ARankSendingMoreThanTheReceiverNeedsIsRefusedNamingTheTensor) {
  ServeProcess serve(receiver_options(versions_->v1_path(), 0, 2));
  const int port = serve.get("/ferry/session").body.value("port", 0);
  session::Channel ch(session::connect_tcp("127.0.0.1", port, session::deadline_in(5000ms), "test"),
                      "receiver");
  // Rank 0 of 1, holding every tensor whole, sending only what the receiver needs.
  const auto& tensors = versions_->v2.tensors;
  {
    capnp::MallocMessageBuilder m;
    auto hello = m.initRoot<wire::Message>().initHello();
    hello.setProtocolVersion(wire::PROTOCOL_VERSION);
    hello.setSenderName("hostile rank");
    auto list = hello.initTensors(static_cast<unsigned>(tensors.size()));
    auto shard = hello.initShard();
    shard.setWorld(1);
    shard.setSendsNeeds(true);
    auto holdings = shard.initHoldings(static_cast<unsigned>(tensors.size()));
    for (unsigned i = 0; i < tensors.size(); ++i) {
      const auto n = static_cast<unsigned>(tensors[i].shape.size());
      list[i].setName(tensors[i].name);
      list[i].setDtype(tensors[i].dtype);
      auto shape = list[i].initShape(n);
      holdings[i].setTensor(i);
      auto offsets = holdings[i].initOffsets(n);
      auto extents = holdings[i].initExtents(n);
      for (unsigned d = 0; d < n; ++d) {
        shape.set(d, tensors[i].shape[d]);
        offsets.set(d, 0);
        extents.set(d, tensors[i].shape[d]);
      }
    }
    hello.setTransport("inline");
    hello.setTransportRequired(true);
    hello.setBucketBytes(1 << 20);
    hello.setSlots(2);
    ch.send(m, session::deadline_in(5000ms), "hello");
  }
  auto welcome = ch.recv(session::deadline_in(10000ms), "welcome");
  ASSERT_EQ(welcome->root().which(), wire::Message::WELCOME);
  auto needs = welcome->root().getWelcome().getNeeds();
  ASSERT_EQ(needs.size(), tensors.size());
  // The embedding is split by rows across the two tensor-parallel ranks: tp rank 0 needs half.
  unsigned embed = 0;
  while (tensors[embed].name != "model.embed_tokens.weight") ++embed;
  ASSERT_EQ(needs[embed].getExtents()[0], tensors[embed].shape[0] / 2);
  {
    capnp::MallocMessageBuilder m;
    auto b = m.initRoot<wire::Message>().initBegin();
    b.setVersion(2);
    b.setBucketCount(1);
    ch.send(m, session::deadline_in(5000ms), "begin");
    auto ready = ch.recv(session::deadline_in(10000ms), "ready");
    ASSERT_EQ(ready->root().which(), wire::Message::READY);
  }
  // The whole embedding instead of the rows asked for.
  const Tensor& t = tensors[embed];
  manifest::Manifest man;
  man.version = 2;
  man.bucket_count = 1;
  man.bucket_bytes = t.bytes.size();
  man.tensors.push_back({t.name, t.dtype, t.shape, 0, t.bytes.size(),
                         kernels::fingerprint_cpu(t.bytes.data(), t.bytes.size(), 1), std::nullopt,
                         std::nullopt, manifest::Block{t.shape, {0, 0}}});
  const auto manifest_bytes = manifest::encode(man);
  capnp::MallocMessageBuilder m;
  auto br = m.initRoot<wire::Message>().initBucket();
  br.setBytes(t.bytes.size());
  br.setManifest(kj::arrayPtr(manifest_bytes.data(), manifest_bytes.size()));
  br.setDataFollows(true);
  ch.send(m, session::deadline_in(5000ms), "bucket");
  ch.send_data(std::as_bytes(std::span(t.bytes.data(), t.bytes.size())),
               session::deadline_in(5000ms), "bucket data");
  std::string refusal;
  for (int i = 0; i < 8 && refusal.empty(); ++i) {
    auto msg = ch.recv(session::deadline_in(10000ms), "refusal");
    if (msg->root().which() == wire::Message::REFUSAL) {
      EXPECT_EQ(msg->root().getRefusal().getCode(),
                static_cast<std::uint32_t>(FERRY_STATUS_CORRUPT_DATA));
      refusal = msg->root().getRefusal().getMessage().cStr();
    }
  }
  EXPECT_NE(refusal.find("'model.embed_tokens.weight'"), std::string::npos) << refusal;
  EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20)) << serve.log();
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 2));
}

TEST_F(SessionSharded, OverlappingBlocksAreRefusedNamingTheRanksAndTheTensor) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  const Tensor& embed = versions_->v2.at("model.embed_tokens.weight");
  for (const auto& t : versions_->v2.tensors) {
    if (t.name == embed.name) {
      ranks[0].views.push_back(rows_of(t, 0, 9));
      ranks[1].views.push_back(rows_of(t, 8, t.shape[0]));
    } else {
      ranks[0].views.push_back(whole(t));
    }
  }
  push_in_process(ranks, address_of(serve));
  for (const auto& r : ranks) {
    ASSERT_FALSE(r.report.all_committed());
    const std::string& error = r.report.receivers[0].error;
    EXPECT_NE(error.find("'model.embed_tokens.weight'"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 0 [0:9, 0:8] and rank 1 [8:16, 0:8] overlap"), std::string::npos)
        << error;
  }
  expect_unchanged(serve);
}

TEST_F(SessionSharded, ABlockNobodySendsIsRefusedNamingTheTensorAndAnElement) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  for (const auto& t : versions_->v2.tensors) {
    if (t.name == "model.embed_tokens.weight") {
      ranks[0].views.push_back(rows_of(t, 0, 6));
      ranks[1].views.push_back(rows_of(t, 7, t.shape[0]));  // row 6 missing
    } else {
      ranks[1].views.push_back(whole(t));
    }
  }
  push_in_process(ranks, address_of(serve));
  for (const auto& r : ranks) {
    ASSERT_FALSE(r.report.all_committed());
    const std::string& error = r.report.receivers[0].error;
    EXPECT_NE(error.find("tensor 'model.embed_tokens.weight' [16, 8]: the senders' blocks cover "
                         "120 of its 128 elements; no rank sends element [6, 0]"),
              std::string::npos)
        << error;
  }
  expect_unchanged(serve);
}

TEST_F(SessionSharded, AReplicatedBlockSentTwiceIsRefused) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  for (const auto& t : versions_->v2.tensors) {
    ranks[0].views.push_back(whole(t));
    ranks[1].views.push_back(whole(t, t.name != "model.norm.weight"));
  }
  push_in_process(ranks, address_of(serve));
  for (const auto& r : ranks) {
    ASSERT_FALSE(r.report.all_committed());
    const std::string& error = r.report.receivers[0].error;
    EXPECT_NE(error.find("tensor 'model.norm.weight': the blocks of rank 0 [0:8] and rank 1 "
                         "[0:8] overlap"),
              std::string::npos)
        << error;
  }
  expect_unchanged(serve);
}

TEST_F(SessionSharded, RanksThatBeginDifferentVersionsAbortTheUpdate) {
  ServeProcess serve(receiver_options(versions_->v1_path()));
  std::vector<Rank> ranks(2);
  for (const auto& t : versions_->v2.tensors) {
    ranks[0].views.push_back(rows_of(t, 0, t.shape[0] / 2));
    ranks[1].views.push_back(rows_of(t, t.shape[0] / 2, t.shape[0]));
  }
  push_in_process(ranks, address_of(serve), {2, 3});
  for (const auto& r : ranks) {
    ASSERT_FALSE(r.report.all_committed());
    const std::string& error = r.report.receivers[0].error;
    EXPECT_TRUE(error.find("rank 1 began version 3, but rank 0 began version 2") !=
                    std::string::npos ||
                error.find("rank 0 began version 2, but rank 1 began version 3") !=
                    std::string::npos)
        << error;
  }
  expect_unchanged(serve);
}

}  // namespace
}  // namespace ferry::test
