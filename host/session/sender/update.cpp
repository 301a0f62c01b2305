// One update over an open session: Begin, buckets, Commit (see session/sender/update.hpp and
// docs/session-protocol.md).
#include "session/sender/update.hpp"

#include <ferry/sdk/error.hpp>

#include "common/log.hpp"
#include "session/sender/delivery.hpp"

namespace ferry::session {
namespace {

// How long the sender polls for a Ready or a Committed before it sleeps on the socket: both
// come within ~0.1-0.5 ms of the request, and a wake-up adds tens of microseconds each.
constexpr std::chrono::microseconds kAnswerSpin{2000};

// When begin() sent the Begin, had the early copies queued and heard Ready, from its start.
struct BeginTimes {
  double sent_ms = 0, queued_ms = 0, ready_ms = 0;
};

// Sends the Begin, queues the early groups' copies meanwhile, and waits for the Ready.
BeginTimes begin(Delivery& d) {
  const auto start = Clock::now();
  const auto ms = [&] { return seconds_since(start) * 1e3; };
  BeginTimes times;
  Channel& ch = d.ch;
  capnp::MallocMessageBuilder m;
  auto b = m.initRoot<wire::Message>().initBegin();
  b.setVersion(d.version);
  b.setLabel(d.label);
  b.setBucketCount(d.bucket_count());
  b.setTotalBytes(d.plan.total);
  b.setViaPut(d.data.uses_put());
  b.setDirect(d.direct);
  b.setWriterFingerprints(d.writer_prints);
  b.setFingerprintsAtCommit(d.prints_at_commit);
  b.setReadsTensors(d.mode == DeliveryMode::read);
  ch.send(m, deadline_in(d.options.bucket_timeout), "begin");
  times.sent_ms = ms();
  for (std::size_t g = 0; g < d.queued_early; ++g) {
    d.start_group(g, deadline_in(d.options.bucket_timeout), false);
  }
  times.queued_ms = ms();
  auto msg = ch.recv(deadline_in(d.options.bucket_timeout), "begin (ready)", kAnswerSpin);
  times.ready_ms = ms();
  auto root = msg->root();
  throw_if_refused(root, fmt::format("{}: refused begin", ch.peer()));
  if (root.which() == wire::Message::CLOSING) {
    fail(FERRY_STATUS_PEER_FAILED, "{}: begin: the receiver closed the session ({})", ch.peer(),
         text(root.getClosing().getReason()));
  }
  if (root.which() != wire::Message::READY) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: begin: unexpected message", ch.peer());
  }
  return times;
}

// Sends the Commit (with the copies' fingerprints when the receiver takes them there) and
// waits for the Committed of `version`.
void commit(Delivery& d) {
  Channel& ch = d.ch;
  capnp::MallocMessageBuilder m;
  auto commit = m.initRoot<wire::Message>().initCommit();
  commit.setVersion(d.version);
  if (d.prints_at_commit) {
    // Every copy completed (finish_pieces): the fingerprints are in.
    std::uint32_t entries = 0;
    for (const auto& b : d.plan.buckets) entries += static_cast<std::uint32_t>(b.items.size());
    auto list = commit.initFingerprints(entries);
    std::uint32_t at = 0;
    for (const auto& b : d.plan.buckets) {
      for (const auto& item : b.items) list.set(at++, d.session_prints[item.first]);
    }
    // The copies' chunk hashes, where the receiver asked for them (Destination.chunkHashes).
    if (!d.session_chunks.empty()) {
      auto lists = commit.initChunkHashes(entries);
      at = 0;
      for (const auto& b : d.plan.buckets) {
        for (const auto& item : b.items) {
          const auto& hashes = d.session_chunks[item.first];
          auto one = lists.init(at++, static_cast<unsigned>(hashes.size()));
          for (unsigned j = 0; j < hashes.size(); ++j) one.set(j, hashes[j]);
        }
      }
    }
  }
  ch.send(m, deadline_in(d.options.commit_timeout), "commit");
  auto msg = ch.recv(deadline_in(d.options.commit_timeout), "commit", kAnswerSpin);
  auto root = msg->root();
  throw_if_refused(root, fmt::format("{}: refused the commit", ch.peer()));
  if (root.which() != wire::Message::COMMITTED) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit: unexpected message", ch.peer());
  }
  if (root.getCommitted().getVersion() != d.version) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: committed version {} instead of {}", ch.peer(),
         root.getCommitted().getVersion(), d.version);
  }
  // A sharded update: what each rank moved and what the receiver needed.
  d.result.rank_bytes.clear();
  for (auto b : root.getCommitted().getRankBytes()) d.result.rank_bytes.push_back(b);
  d.result.needed_bytes = root.getCommitted().getNeededBytes();
}

}  // namespace

void run_update(SenderState& state, Link& link, std::size_t index,
                std::span<const TensorView> tensors, const PushPlan& plan, std::uint64_t version,
                const std::string& label, ReceiverResult& result, bool& began) {
  const auto session_start = Clock::now();
  Delivery d(state, link, index, tensors, plan, version, label, result);
  const double prepared_ms = seconds_since(session_start) * 1e3;
  if (!d.writer_prints) plan.seal();
  result.transport = d.data.name();
  result.direct = d.direct;
  result.writer_fingerprints = d.writer_prints;
  result.reads_in_place = d.mode == DeliveryMode::read;
  result.takes_pieces = link.takes_pieces;
  {
    std::lock_guard lock(state.mutex);
    state.results[index].transport = d.data.name();
  }
  const BeginTimes times = begin(d);
  began = true;
  const auto launch_start = Clock::now();
  if (d.queued_early > 0) plan.await_producers();  // the copies queued early read from here on
  const double producers_ms = seconds_since(launch_start) * 1e3;
  for (std::size_t g = 0; g < d.queued_early; ++g) {
    d.data.launch_pieces(deadline_in(d.options.bucket_timeout), d.group_name(g));
  }
  const double setup_s = seconds_since(session_start);
  switch (d.mode) {
    case DeliveryMode::staged: deliver_staged(d); break;
    case DeliveryMode::direct: deliver_direct(d); break;
    case DeliveryMode::direct_prints_at_commit: deliver_direct_prints_at_commit(d); break;
    case DeliveryMode::read:
      deliver_read(d);
      break;
  }
  d.await_acks(d.bucket_count());
  const auto commit_start = Clock::now();
  commit(d);
  logger("sender")->debug(
      "{}: version {}: {} buckets, {} tensors: begin {:.3f} ms{} (prepared {:.3f} ms, Begin sent "
      "{:.3f} ms later, copies queued at {:.3f} ms, Ready at {:.3f} ms, then waited {:.3f} ms for "
      "the producers), delivering {:.3f} ms, "
      "announcing {:.3f} ms, waiting for acks {:.3f} ms, commit {:.3f} ms (receiver's checks "
      "included), session {:.3f} ms",
      state.options.receivers[index], version, d.bucket_count(), tensors.size(), setup_s * 1e3,
      d.queued_early > 0 ? " (the first copies queued meanwhile)" : "", prepared_ms, times.sent_ms,
      times.queued_ms, times.ready_ms, producers_ms, d.deliver_s * 1e3, d.announce_s * 1e3,
      d.ack_s * 1e3, seconds_since(commit_start) * 1e3, seconds_since(session_start) * 1e3);
}

}  // namespace ferry::session
