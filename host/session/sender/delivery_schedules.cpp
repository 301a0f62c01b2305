// The delivery schedules, one per delivery mode the handshake chose (see
// session/sender/delivery.hpp): the order in which a bucket's bytes are delivered, its
// announcement sent and the acks awaited, so that the copies run back to back while the control
// messages go out and no more is in flight than the slots and the data path allow.
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstring>

#include "common/log.hpp"
#include "session/sender/delivery.hpp"
#include "session/sender/tensor_reads.hpp"

namespace ferry::session {

// Staged: bucket k goes into slot k % kSlots once the ack of bucket k - kSlots freed it: put
// tensor by tensor from their own memory where the data path can (a device transport and CUDA
// tensors), else packed into the local slot and delivered whole; then announced.
void deliver_staged(Delivery& d) {
  d.plan.await_producers();
  SenderDataPath& data = d.data;
  for (std::uint32_t k = 0; k < d.bucket_count(); ++k) {
    const std::string phase = fmt::format("bucket {}", k);
    const std::uint32_t slot = k % kSlots;
    if (k >= kSlots) d.await_ack();
    const auto& b = d.plan.buckets[k];
    const auto deadline = deadline_in(d.options.bucket_timeout);
    const auto deliver_start = Clock::now();
    if (b.cuda && data.delivers_pieces(FERRY_MEMORY_CUDA)) {
      data.deliver_pieces(slot, k, d.pieces_of(b), deadline, phase);
    } else {
      auto dst = data.slot(slot);
      std::uint64_t cursor = 0;
      for (const auto& [t, offset] : b.items) {
        // Zero the alignment padding so the bytes on the wire are deterministic.
        if (offset > cursor) std::memset(dst.data() + cursor, 0, offset - cursor);
        const auto size = d.plan.sizes[t];
        copy_to_host(dst.data() + offset, d.tensors[t], size);
        cursor = offset + size;
      }
      data.deliver(slot, k, b.bytes, deadline, phase);
    }
    const double bucket_deliver_s = seconds_since(deliver_start);
    d.deliver_s += bucket_deliver_s;
    logger("sender")->debug("{}: bucket {}: {} tensors, {} bytes delivered in {:.3f} ms",
                            d.options.receivers[d.index], k, b.items.size(), b.bytes,
                            bucket_deliver_s * 1e3);
    d.announce(k, deadline);
  }
}

// Direct: pipelined, group g's copies are queued before group g-1 is finished and announced,
// so the copies run back to back while the control messages go out. No slot is written; the
// acks of group g - kSlots still bound the groups in flight.
void deliver_direct(Delivery& d) {
  auto finish_and_announce = [&](std::size_t g, Clock::time_point deadline) {
    d.finish_group(g, deadline);
    for (std::uint32_t k = d.groups[g].first; k < d.groups[g].second; ++k) d.announce(k, deadline);
  };
  auto deadline = deadline_in(d.options.bucket_timeout);
  for (std::size_t g = 0; g < d.groups.size(); ++g) {
    if (g >= kSlots) d.await_acks(d.groups[g - kSlots].second);
    if (g >= d.queued_early) d.start_group(g, deadline_in(d.options.bucket_timeout));
    if (g > 0) finish_and_announce(g - 1, deadline);
    deadline = deadline_in(d.options.bucket_timeout);
  }
  if (!d.groups.empty()) finish_and_announce(d.groups.size() - 1, deadline);
}

// Direct with the copies' fingerprints at commit: each group is announced as soon as its copies
// are queued, at most kMaxStartedPieces groups unfinished (data_path.hpp: the next group is
// queued while two run, so the GPU never has only one group's copies to do), and a group's acks
// are awaited once its copies completed (bounding what is in flight). Every group is finished
// before the Commit, which carries their fingerprints.
void deliver_direct_prints_at_commit(Delivery& d) {
  std::size_t started = d.queued_early;
  std::size_t finished = 0;
  auto finish_oldest = [&] {
    d.finish_group(finished, deadline_in(d.options.bucket_timeout));
    ++finished;
  };
  for (std::size_t g = 0; g < d.groups.size(); ++g) {
    // The next group's copies are queued before this group is announced (an announcement of
    // 128 tensors costs ~35 us): the GPU gets them sooner.
    while (started < std::min(g + 2, d.groups.size())) {
      if (started >= kMaxStartedPieces) {
        finish_oldest();
        d.await_acks(d.groups[finished - 1].second);
      }
      d.start_group(started, deadline_in(d.options.bucket_timeout));
      ++started;
    }
    const auto group_deadline = deadline_in(d.options.bucket_timeout);
    for (std::uint32_t k = d.groups[g].first; k < d.groups[g].second; ++k) {
      d.announce(k, group_deadline);
    }
  }
  while (finished < started) finish_oldest();
}

// Read in place: the receiver maps each bucket's tensors (their keys go with its announcement)
// and applies its plan from them; nothing is written here. The manifests carry the tensors'
// fingerprints (the plan's, computed after the wait for their producers), against which the
// receiver verifies what it read before it commits (the tensors stay lent until the Committed).
// The acks of bucket k - kSlots bound the buckets announced and not yet applied.
void deliver_read(Delivery& d) {
  // While the tensors' fingerprints are computed (each announcement waits for its bucket's).
  d.data.check_lent();
  d.plan.await_producers();  // (the announcements wait for the fingerprints, which wait too)
  for (std::uint32_t k = 0; k < d.bucket_count(); ++k) {
    if (k >= kSlots) d.await_ack();
    d.announce(k, deadline_in(d.options.bucket_timeout));
  }
}

}  // namespace ferry::session
