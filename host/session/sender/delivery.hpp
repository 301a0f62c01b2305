// session/sender/delivery.hpp: how one update's buckets reach a receiver between its Ready and
// its Commit (update.hpp drives the rest). The handshake settled one of four delivery modes,
// and each has its schedule (delivery_schedules.cpp):
//   staged                   each bucket into a staging slot of the receiver (packed on the
//                            host, or put from the tensors' own memory), then announced; a slot
//                            is reused once its previous bucket is acked.
//   direct                   copy groups straight into the receiver's parameters, each group
//                            announced once its copies completed.
//   direct, prints at commit the copies fingerprint what they write and the receiver takes
//                            those fingerprints with the Commit: each group is announced as soon
//                            as its copies are queued.
//   read                     nothing is written: each bucket is announced with the keys of its
//                            tensors' memory, which the receiver maps and applies its plan from
//                            (reads in place; the tensors stay lent until the Committed).
// A Delivery holds what the schedules share: the pieces of a bucket, the copy groups, starting
// and finishing a group, announcing a bucket and awaiting its ack, and the phase timings.
//
// Threading: one session thread drives a Delivery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "session/channel.hpp"
#include "session/data_path.hpp"
#include "session/sender/push_plan.hpp"
#include "session/sender/receiver_link.hpp"
#include "session/sender/sender_state.hpp"

namespace ferry::session {

enum class DeliveryMode { staged, direct, direct_prints_at_commit, read };

struct Delivery {
  Delivery(SenderState& state, const Link& link, std::size_t index,
           std::span<const TensorView> tensors, const PushPlan& plan, std::uint64_t version,
           const std::string& label, ReceiverResult& result);

  SenderState& state;
  const SenderOptions& options;
  Channel& ch;
  SenderDataPath& data;
  const Link& link;
  std::size_t index;  // the receiver (SenderOptions::receivers order)
  std::span<const TensorView> tensors;
  const PushPlan& plan;
  std::uint64_t version;
  const std::string& label;
  ReceiverResult& result;

  DeliveryMode mode = DeliveryMode::staged;
  bool direct = false;            // mode != staged
  bool writer_prints = false;     // direct, and the copies fingerprint what they write
  bool prints_at_commit = false;  // those fingerprints go with the Commit
  // Per tensor, from the copies (writer_prints); complete once every group is finished.
  std::vector<std::uint64_t> session_prints;
  // Per tensor whose receiver takes its chunk hashes (Link::chunk_bases, with fingerprints at
  // commit and a transport that hashes its puts' chunks): the copy's chunk hashes; else empty.
  std::vector<std::vector<std::uint64_t>> session_chunks;
  // The fingerprints of the heads of tensors put in two copies (Link::ChunkPlace::head): where
  // their copies write them; nobody reads them.
  std::vector<std::uint64_t> head_prints;
  // Direct delivery copies in groups, [first, end) buckets: one bucket, or, where the copies
  // fingerprint what they write, consecutive buckets of at least
  // SenderOptions::fingerprinted_group_bytes (the fingerprinting kernel needs thousands of
  // 1 MiB chunks per launch to fill the GPU). Empty when staged.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> groups;
  // Groups queued before the Ready and launched once it is in (update.cpp); the schedules
  // start the others.
  std::size_t queued_early = 0;
  std::uint32_t acked = 0;  // buckets acknowledged so far

  // Phase timings for --log-level debug (where a push spends its time, per receiver).
  double deliver_s = 0;   // puts + flush (or packing + deliver) of every bucket
  double ack_s = 0;       // waiting for acks (the receiver's apply and checks)
  double announce_s = 0;  // the buckets' announcements (manifests made and sent)

  std::uint32_t bucket_count() const { return static_cast<std::uint32_t>(plan.buckets.size()); }
  // The pieces of a bucket for a device transport: each tensor from its own memory into the
  // receiver's slot, or (direct) straight into its destination in the receiver's parameters.
  std::vector<TensorPiece> pieces_of(const PlannedBucket& b);
  std::string group_name(std::size_t g) const;
  // Queues group g's copies (at most kMaxStartedPieces groups started and not finished); with
  // `launch` false they wait for data.launch_pieces().
  void start_group(std::size_t g, Clock::time_point deadline, bool launch = true);
  // Waits until the oldest started group's copies (group g) are complete.
  void finish_group(std::size_t g, Clock::time_point deadline);
  // Announces bucket k: its bytes are in place, or (prints_at_commit) its copies are queued.
  void announce(std::uint32_t k, Clock::time_point deadline);
  // Waits for the next bucket's Ack and checks its fingerprints (direct delivery: an Ack
  // without fingerprints; the receiver verifies what was written in place at commit, against
  // the manifests' fingerprints).
  void await_ack();
  // Awaits acks until `end` buckets are acknowledged.
  void await_acks(std::uint32_t end) {
    while (acked < end) await_ack();
  }
};

// The schedules (delivery_schedules.cpp), called once the receiver is Ready; each returns with
// every bucket announced (the last acks are awaited by the caller).
void deliver_staged(Delivery& d);
void deliver_direct(Delivery& d);
void deliver_direct_prints_at_commit(Delivery& d);
void deliver_read(Delivery& d);

}  // namespace ferry::session
