// What the delivery schedules of one update share (see session/sender/delivery.hpp).
#include "session/sender/delivery.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>

namespace ferry::session {

Delivery::Delivery(SenderState& state_, const Link& link_, std::size_t index_,
                   std::span<const TensorView> tensors_, const PushPlan& plan_,
                   std::uint64_t version_, const std::string& label_, ReceiverResult& result_)
    : state(state_),
      options(state_.options),
      ch(*link_.channel),
      data(*link_.data),
      link(link_),
      index(index_),
      tensors(tensors_),
      plan(plan_),
      version(version_),
      label(label_),
      result(result_),
      direct(link_.direct),
      writer_prints(link_.writer_prints),
      // The copies' fingerprints go with the Commit, and each bucket is announced as soon as
      // its copies are queued (Begin.fingerprintsAtCommit): the receiver records it while the
      // copies run, and only the Commit waits for them.
      prints_at_commit(link_.writer_prints && link_.prints_at_commit) {
  if (prints_at_commit) {
    mode = DeliveryMode::direct_prints_at_commit;
  } else if (direct) {
    mode = DeliveryMode::direct;
  } else if (link_.reads && plan.cuda_tensors) {
    // A kept session's push of tensors that are not all CUDA memory stages instead.
    mode = DeliveryMode::read;
  }
  if (writer_prints) {
    session_prints.assign(tensors.size(), 0);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      // An empty tensor is no copy: its fingerprint is that of nothing.
      if (plan.sizes[t] == 0) session_prints[t] = kernels::fingerprint_cpu(nullptr, 0, 1);
    }
  }
  if (prints_at_commit && data.hashes_piece_chunks() && link.chunk_bases.size() == tensors.size()) {
    session_chunks.resize(tensors.size());
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const auto& place = link.chunk_bases[t];
      // A head as long as the tensor (a receiver's mistake) leaves nothing to hash: no hashes.
      if (!place || plan.sizes[t] == 0 || place->head >= plan.sizes[t]) continue;
      session_chunks[t].assign((plan.sizes[t] - place->head + kernels::kFingerprintChunkBytes - 1) /
                                   kernels::kFingerprintChunkBytes,
                               0);
      if (place->head > 0) head_prints.resize(tensors.size(), 0);
    }
  }
  const std::uint32_t count = bucket_count();
  for (std::uint32_t k = 0; direct && k < count;) {
    std::uint32_t end = k + 1;
    std::uint64_t bytes = plan.buckets[k].bytes;
    while (writer_prints && end < count && bytes < options.fingerprinted_group_bytes) {
      bytes += plan.buckets[end++].bytes;
    }
    groups.emplace_back(k, end);
    k = end;
  }
  // Where the transport's puts write nothing before their flush, the first two groups' copies
  // are queued while the receiver begins (its Begin -> Ready round trip, ~0.4 ms) and launched
  // once it is Ready. A flush issues every put queued before it, so both go as one launch of
  // twice the chunks, and the third group's launch runs beside it from the start (cuda_ipc's
  // copy lanes). Against one group queued early this keeps the worse of the two tensor counts
  // measured, the one the target bounds, above the target (docs/benchmarks.md, "The first two
  // groups are queued before the Ready"). Nothing is written before the Ready; a refusal drops
  // the session, and the queued copies with it.
  queued_early = data.defers_pieces() ? std::min<std::size_t>(groups.size(), 2) : 0;
}

std::vector<TensorPiece> Delivery::pieces_of(const PlannedBucket& b) {
  std::vector<TensorPiece> pieces;
  pieces.reserve(b.items.size());
  for (const auto& [t, offset] : b.items) {
    TensorPiece p;
    p.data = tensors[t].data;
    p.size = plan.sizes[t];
    p.offset = offset;
    p.kind = tensors[t].memory_kind;
    p.device = tensors[t].device;
    if (direct) {
      p.region = link.destinations[t].first;
      p.offset = link.destinations[t].second;
    }
    if (writer_prints) p.fingerprint = &session_prints[t];
    if (t < session_chunks.size() && !session_chunks[t].empty()) {
      const auto place = *link.chunk_bases[t];
      if (place.head > 0) {
        // The tensor starts inside a chunk of its parameter: its first `head` bytes as a copy
        // of their own (their fingerprint unused: the receiver reads that chunk again), the
        // rest hashed chunk by chunk on the parameter's chunk boundaries. The Commit carries
        // the rest's fingerprint.
        TensorPiece head = p;
        head.size = place.head;
        head.fingerprint = &head_prints[t];
        pieces.push_back(head);
        p.data = static_cast<const std::byte*>(p.data) + place.head;
        p.size -= place.head;
        p.offset += place.head;
      }
      p.chunk_hashes = session_chunks[t].data();
      p.chunk_base = place.base;
    }
    pieces.push_back(p);
  }
  return pieces;
}

std::string Delivery::group_name(std::size_t g) const {
  const auto [first, end] = groups[g];
  return end - first == 1 ? fmt::format("bucket {}", first)
                          : fmt::format("buckets {}..{}", first, end - 1);
}

void Delivery::start_group(std::size_t g, Clock::time_point deadline, bool launch) {
  // Copies queued and not launched read nothing yet (data.defers_pieces()).
  if (launch || !data.defers_pieces()) plan.await_producers();
  const auto deliver_start = Clock::now();
  std::vector<TensorPiece> pieces;
  for (std::uint32_t k = groups[g].first; k < groups[g].second; ++k) {
    auto more = pieces_of(plan.buckets[k]);
    pieces.insert(pieces.end(), more.begin(), more.end());
  }
  data.start_pieces(static_cast<std::uint32_t>(g % kSlots), groups[g].first, std::move(pieces),
                    deadline, group_name(g), launch);
  deliver_s += seconds_since(deliver_start);
}

void Delivery::finish_group(std::size_t g, Clock::time_point deadline) {
  const auto deliver_start = Clock::now();
  data.finish_pieces(deadline, group_name(g));
  deliver_s += seconds_since(deliver_start);
}

void Delivery::announce(std::uint32_t k, Clock::time_point deadline) {
  const auto announce_start = Clock::now();
  const std::string phase = fmt::format("bucket {}", k);
  const std::uint32_t slot = k % kSlots;
  const auto& b = plan.buckets[k];
  capnp::MallocMessageBuilder m;
  auto br = m.initRoot<wire::Message>().initBucket();
  br.setIndex(k);
  br.setSlot(slot);
  br.setBytes(b.bytes);
  if (prints_at_commit) {
    const auto manifest = bucket_manifest(plan, k, tensors, version, label, {});
    br.setManifest(kj::arrayPtr(manifest.data(), manifest.size()));
  } else if (writer_prints) {
    // The fingerprints of bucket k's copies are in: its manifest carries them.
    const auto manifest = bucket_manifest(plan, k, tensors, version, label, session_prints);
    br.setManifest(kj::arrayPtr(manifest.data(), manifest.size()));
  } else {
    plan.wait_sealed(k);
    br.setManifest(kj::arrayPtr(b.manifest.data(), b.manifest.size()));
  }
  br.setDataFollows(data.data_follows());
  if (mode == DeliveryMode::read) {
    // Where the receiver reads each entry: the tensor's memory, lent (registered once per kept
    // session) with its key.
    auto sources = br.initSources(static_cast<unsigned>(b.items.size()));
    for (unsigned i = 0; i < b.items.size(); ++i) {
      const std::size_t t = b.items[i].first;
      if (plan.sizes[t] == 0) continue;
      const auto key = data.lend(tensors[t].data, plan.sizes[t]);
      sources.set(i, kj::arrayPtr(key.data(), key.size()));
    }
  }
  ch.send(m, deadline, phase);
  data.after_header(ch, slot, b.bytes, deadline, phase);
  result.bytes += b.bytes;
  result.buckets += 1;
  {
    std::lock_guard lock(state.mutex);
    state.results[index].buckets = result.buckets;
    state.results[index].bytes = result.bytes;
  }
  if (options.progress) {
    PushProgress p;
    p.event = PushProgress::Event::bucket;
    p.version = version;
    p.receivers = options.receivers.size();
    p.receiver = index;
    p.bytes_done = result.bytes;
    p.bytes_total = plan.bucket_total;
    options.progress(p);
  }
  announce_s += seconds_since(announce_start);
  if (options.after_bucket) options.after_bucket(options.receivers[index], k);
}

void Delivery::await_ack() {
  const auto ack_start = Clock::now();
  const std::uint32_t k = acked;
  const std::string phase = fmt::format("bucket {} (ack)", k);
  auto msg = ch.recv(deadline_in(options.bucket_timeout), phase);
  auto root = msg->root();
  throw_if_refused(root, fmt::format("{}: refused during {}", ch.peer(), phase));
  if (root.which() != wire::Message::ACK) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected message", ch.peer(), phase);
  }
  auto ack = root.getAck();
  if (ack.getIndex() != k) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: got the ack of bucket {}", ch.peer(), phase,
         ack.getIndex());
  }
  auto prints = ack.getFingerprints();
  if (!direct || prints.size() != 0) {
    plan.wait_sealed(k);
    const auto& b = plan.buckets[k];
    if (prints.size() != b.fingerprints.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: {} fingerprints for {} tensors", ch.peer(), phase,
           prints.size(), b.fingerprints.size());
    }
    for (unsigned i = 0; i < prints.size(); ++i) {
      if (prints[i] != b.fingerprints[i]) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: {}: tensor '{}' arrived with fingerprint {:016x}, sent {:016x}", ch.peer(),
             phase, tensors[b.items[i].first].name, prints[i], b.fingerprints[i]);
      }
    }
  }
  ack_s += seconds_since(ack_start);
  ++acked;
}

}  // namespace ferry::session
