// The trainer side: plans buckets once, then runs one session per receiver on its own thread,
// through the session kept from the previous push where it fits (see session/sender/sender.hpp
// and docs/session-protocol.md).
#include "session/sender/sender.hpp"

#include <kj/exception.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/log.hpp"
#include "session/sender/discovery.hpp"
#include "session/sender/handshake.hpp"
#include "session/sender/push_plan.hpp"
#include "session/sender/receiver_link.hpp"
#include "session/sender/sender_state.hpp"
#include "session/sender/update.hpp"

namespace ferry::session {

namespace {

// The block views of a sharded push: in range and of the tensor's rank.
void check_shard_views(std::span<const TensorView> tensors, const ShardSpec& shard) {
  if (shard.rank >= shard.world) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "push: rank {} of a world of {} senders", shard.rank,
         shard.world);
  }
  for (const auto& t : tensors) {
    const auto& global = t.global_shape.empty() ? t.shape : t.global_shape;
    if (global.size() != t.shape.size() ||
        (!t.offsets.empty() && t.offsets.size() != t.shape.size())) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "push: tensor '{}': a block of {} dims with {} offsets in a global shape of {} dims",
           t.name, t.shape.size(), t.offsets.size(), global.size());
    }
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      const std::uint64_t at = t.offsets.empty() ? 0 : t.offsets[d];
      if (at + t.shape[d] > global[d] || at + t.shape[d] < at) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "push: tensor '{}': the block at offset {} of extent {} on dim {} lies outside "
             "its global extent {}",
             t.name, at, t.shape[d], d, global[d]);
      }
    }
  }
}

// The Refusal a receiver sent before it closed the connection, if one is still to be read
// (messages before it, such as acks, are skipped).
std::optional<Error> pending_refusal(Channel& ch, const std::string& address) {
  try {
    const auto deadline = deadline_in(std::chrono::milliseconds(200));
    for (int i = 0; i < 64; ++i) {
      auto msg = ch.recv(deadline, "refusal");
      auto root = msg->root();
      if (root.which() != wire::Message::REFUSAL) continue;
      auto r = root.getRefusal();
      return Error(
          static_cast<ferry_status_code_t>(r.getCode()),
          fmt::format("receiver {} refused the update: {}", address, text(r.getMessage())));
    }
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace

bool PushReport::all_committed() const {
  if (receivers.empty()) return false;
  for (const auto& r : receivers) {
    if (!r.committed) return false;
  }
  return true;
}

struct Sender::Impl : SenderState {
  // A push's data paths and channels go away after it returns (deregistrations, disconnect,
  // unmapping the receiver's memory: ~2 ms that are not part of the update); the next push, and
  // the Sender's destruction, wait for them first, so nothing accumulates.
  std::mutex teardown_mutex;
  std::vector<std::thread> teardowns;
  void wait_teardowns() noexcept {
    std::vector<std::thread> pending;
    {
      std::lock_guard lock(teardown_mutex);
      pending.swap(teardowns);
    }
    for (auto& t : pending) t.join();
  }
  // Per receiver (SenderOptions::receivers order): the session kept from the last push, or
  // null. Only that receiver's push thread touches its entry.
  std::vector<std::unique_ptr<Link>> links;

  Impl(const config::Config& c, const registry::Registry& r, SenderOptions o)
      : SenderState(c, r, std::move(o)), links(options.receivers.size()) {}

  ~Impl() {
    links.clear();  // closes the kept sessions
    wait_teardowns();
  }

  // abort() reaches the link's channel and data path while it is registered.
  void track_link(Link* link, bool on) {
    if (!link) return;
    std::lock_guard lock(mutex);
    if (on) {
      if (link->channel) channels.insert(link->channel.get());
      if (link->data) data_paths.insert(link->data.get());
    } else {
      channels.erase(link->channel.get());
      data_paths.erase(link->data.get());
    }
  }

  // Before the push waits for its tensors' producers (the link's watcher stopped): a kept
  // session that the receiver suspended for a release rejoins now, and its transport maps the
  // resumed memory, while the trainer's last kernels still run (a rejoin reads no tensor). One
  // that fails is left closed with the reason, and run_receiver opens a new session in its
  // place, as it would have.
  void rejoin_early(std::size_t index, std::span<const TensorView> tensors, const PushPlan& plan,
                    std::optional<bool> catalog_same) {
    Link* link = links[index].get();
    if (link->closed || !link->suspended || !link->same_shard(shard, declared) ||
        !link->fits(tensors, plan, catalog_same)) {
      return;  // run_receiver decides, as it does without a release
    }
    track_link(link, true);
    try {
      throw_if_aborted();
      rejoin_session(*this, *link, index, sent_count(*link, tensors), true);
    } catch (const Error& e) {
      logger("sender")->info("{}: kept session closed ({}); opening a new one",
                             options.receivers[index], e.what());
      link->closed = true;
      link->closed_why = e.what();
    } catch (...) {
      // A malformed Rejoined (kj::Exception) or worse: this runs on a thread of its own where
      // nothing may escape; the new session run_receiver opens meets the cause again.
      logger("sender")->info("{}: kept session closed (its rejoin failed); opening a new one",
                             options.receivers[index]);
      link->closed = true;
      link->closed_why = "its rejoin failed";
    }
    track_link(link, false);
  }

  // How many tensors `link` sends of this push's (a rank that sends only parts of its blocks has
  // a destination per part it sends).
  std::size_t sent_count(const Link& link, std::span<const TensorView> tensors) const {
    return link.trims ? link.sent_count(declared) : tensors.size();
  }

  // On a kept session's watcher, between pushes: the receiver says the memory of this
  // suspended session is back, so it rejoins now, and its transport maps the resumed memory,
  // while the trainer still computes; the next push finds it rejoined. Throws when it failed
  // (the watcher then ends the session, and the next push opens a new one). A push that starts
  // meanwhile waits for it (stop_watching).
  void rejoin_when_resumed(std::size_t index, Link& link) {
    track_link(&link, true);
    struct Untrack {
      Impl& impl;
      Link& link;
      ~Untrack() { impl.track_link(&link, false); }
    } untrack{*this, link};
    const auto start = Clock::now();
    rejoin_session(*this, link, index, link.sent_tensors, true);
    logger("sender")->debug("{}: rejoined between pushes, when the receiver resumed ({:.3f} ms)",
                            options.receivers[index], seconds_since(start) * 1e3);
  }

  // After a push of whole tensors (`report`): the next ones go as rank 0 of a 1-rank sharded
  // update where every receiver takes only parts of the tensors (each is then sent only the
  // parts its plan reads, straight into its parameters where the session wrote or read in
  // place); back to whole tensors when such a push fails somewhere. update.delivery "auto" only.
  void choose_whole_as_rank(const PushReport& report) {
    if (!options.parts_as_rank || config.update.delivery != config::Delivery::automatic) return;
    if (whole_as_rank) {
      if (report.all_committed()) return;
      whole_as_rank = false;
      logger("sender")->info(
          "push of version {} as rank 0 of 1 failed on a receiver: the next push sends whole "
          "tensors",
          report.version);
      return;
    }
    const auto& rs = report.receivers;
    whole_as_rank = !rs.empty() && std::all_of(rs.begin(), rs.end(), [](const auto& r) {
      return r.committed && r.takes_pieces;
    });
    if (whole_as_rank) {
      logger("sender")->info(
          "every receiver's plan reads only parts of the tensors (tensor-parallel ranks): from "
          "the next push on they go as rank 0 of a 1-rank sharded update, each receiver sent "
          "only its parts");
    }
  }

  // Runs `work(r)` for every receiver r: on this thread for one, else one thread each.
  template <typename Work>
  void for_each_receiver(const std::vector<std::size_t>& receivers, Work work) {
    if (receivers.size() == 1) {
      work(receivers[0]);
      return;
    }
    std::vector<std::thread> threads;
    threads.reserve(receivers.size());
    for (std::size_t r : receivers) threads.emplace_back([&work, r] { work(r); });
    for (auto& t : threads) t.join();
  }

  // One push to receiver `index`: through the session kept from the previous push when it fits
  // (same tensors, bucket capacity and memory) and is still open, else through a new one. A
  // kept session that turns out closed before its update began (the receiver restarted or
  // stopped, or released its memory and could not keep it) is replaced by a new session within
  // the same push; one the receiver suspended for a release rejoins.
  // `catalog_same`: whether the tensors are the kept session's catalog, where push() compared.
  void run_receiver(std::size_t index, std::span<const TensorView> tensors, const PushPlan& plan,
                    std::uint64_t version, const std::string& label,
                    std::optional<bool> catalog_same) {
    const std::string address = options.receivers[index];
    ReceiverResult result;
    result.address = address;
    const auto start = Clock::now();
    auto update_start = start;
    auto update_end = start;
    std::unique_ptr<Link> link = std::move(links[index]);
    if (link) {
      link->stop_watching();
      std::string why;
      if (link->closed) {
        why = link->closed_why;
      } else if (!link->same_shard(shard, declared)) {
        why = "another rank, world or set of blocks";
      } else if (!link->fits(tensors, plan, catalog_same)) {
        why = "another set of tensors, bucket capacity or device";
      }
      if (!why.empty()) {
        logger("sender")->debug("{}: kept session not used ({})", address, why);
        retire(std::move(link));
      }
    }
    auto track = [&](bool on) { track_link(link.get(), on); };
    try {
      bool done = false;
      if (link) {
        track(true);
        bool began = false;
        try {
          throw_if_aborted();
          result.reused_session = true;
          if (link->suspended) {
            // The receiver released its memory since the last push: a new data path only.
            rejoin_session(*this, *link, index, sent_count(*link, tensors));
            track(true);
          }
          update_start = Clock::now();
          update(*link, index, tensors, plan, version, label, result, began);
          update_end = Clock::now();
          done = true;
        } catch (const Error& e) {
          std::string reason;
          if (began || is_aborted(reason)) throw;
          // Nothing of this update was written: a new session takes over.
          logger("sender")->info("{}: kept session closed ({}); opening a new one", address,
                                 e.what());
          track(false);
          retire(std::move(link));
          result = ReceiverResult{};
          result.address = address;
        }
      }
      if (!done) {
        link = std::make_unique<Link>();
        const TransportChoice transport =
            transport_for(address, plan.cuda_tensors, options, config, registry);
        link->channel = open_channel(address, options);
        track(true);
        throw_if_aborted();
        open_session(*this, *link, index, tensors, plan, transport);
        track(true);  // the data path, created by open_session
        bool began = false;
        update_start = Clock::now();
        update(*link, index, tensors, plan, version, label, result, began);
        update_end = Clock::now();
      }
      result.committed = true;
    } catch (const Error& e) {
      std::string reason;
      result.code = e.code();
      // A receiver that refused while this sender was writing (a sharded update aborted by
      // another rank) closed the connection after its Refusal: the Refusal is the cause.
      std::optional<Error> refusal;
      if (e.code() == FERRY_STATUS_PEER_FAILED && link && link->channel) {
        refusal = pending_refusal(*link->channel, address);
      }
      if (refusal) {
        result.code = refusal->code();
        result.error = refusal->what();
      } else if (is_aborted(reason) && e.code() != FERRY_STATUS_CORRUPT_DATA) {
        result.code = FERRY_STATUS_ABORTED;
        result.error = fmt::format("receiver {}: aborted: {}", address, reason);
      } else {
        result.error = e.what();
        if (result.error.find(address) == std::string::npos) {
          result.error = fmt::format("receiver {}: {}", address, result.error);
        }
      }
      if (link && link->channel && !link->channel->is_shut_down()) {
        try {
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Message>().initAbort().setReason(result.error);
          link->channel->send(m, deadline_in(std::chrono::milliseconds(1000)), "abort");
        } catch (...) {
        }
      }
    } catch (const kj::Exception& e) {
      result.code = FERRY_STATUS_CORRUPT_DATA;
      result.error = fmt::format("receiver {}: malformed session message ({})", address,
                                 e.getDescription().cStr());
    } catch (const std::exception& e) {
      result.code = FERRY_STATUS_INTERNAL;
      result.error = fmt::format("receiver {}: {}", address, e.what());
    }
    track(false);
    if (link && result.committed && link->keep && keep_sessions()) {
      // Kept for the next push; meanwhile its watcher answers the receiver.
      link->forget_push();
      link->sent_tensors = sent_count(*link, tensors);
      if (link->start_watching(address,
                               [this, index](Link& l) { rejoin_when_resumed(index, l); })) {
        links[index] = std::move(link);
      }
    }
    // Not kept: the plugin instance and the channel go on a thread of their own
    // (wait_teardowns()); the receiver has committed or failed by now.
    if (link) retire(std::move(link));
    result.seconds = seconds_since(start);
    if (!result.committed) logger("sender")->warn("{}", result.error);
    if (result.committed) {
      const auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      logger("sender")->debug("{}: {:.3f} ms before the update ({}), {:.3f} ms after it", address,
                              ms(start, update_start),
                              result.reused_session ? "kept session" : "new session",
                              ms(update_end, Clock::now()));
    }
    set_result(index, result);
  }

  // One update over `link` (run_update): the push's plan, or, for a rank whose receiver needs
  // only part of its blocks (Link::trims), those parts under a plan of their own.
  void update(Link& link, std::size_t index, std::span<const TensorView> tensors,
              const PushPlan& plan, std::uint64_t version, const std::string& label,
              ReceiverResult& result, bool& began) {
    if (!link.trims) {
      run_update(*this, link, index, tensors, plan, version, label, result, began);
      return;
    }
    plan.await_producers();  // the column parts are gathered from the tensors
    const std::vector<TensorView> views = link.sent_views(declared);
    PushPlan own = plan_buckets(views, check_tensors(views, true), options.bucket_bytes);
    own.device = plan.device;
    own.before_reads = plan.before_reads;
    PlanSealing sealing(own, views, version, label, options.threads);
    run_update(*this, link, index, views, own, version, label, result, began);
  }

  // Destroys a session that is not kept (unregistrations, disconnect, unmapping the receiver's
  // memory: ~2 ms that are not part of any update) on a thread of its own.
  void retire(std::unique_ptr<Link> link) {
    auto teardown = [link = std::move(link)]() mutable {
      if (!link) return;  // moved into a thread that could not be started, and destroyed there
      const auto teardown_start = Clock::now();
      const std::string peer = link->channel ? link->channel->peer() : std::string("receiver");
      link.reset();
      logger("sender")->debug("{}: data path and channel teardown {:.3f} ms", peer,
                              seconds_since(teardown_start) * 1e3);
    };
    std::lock_guard lock(teardown_mutex);
    try {
      teardowns.emplace_back(std::move(teardown));
    } catch (const std::system_error&) {
      teardown();  // no thread to be had: here
    }
  }
};

Sender::Sender(const config::Config& config, const registry::Registry& registry,
               SenderOptions options)
    : impl_(std::make_unique<Impl>(config, registry, std::move(options))) {}

Sender::~Sender() = default;

PushReport Sender::push(std::span<const TensorView> tensors, std::uint64_t version,
                        const std::optional<std::string>& label,
                        const order::StreamOrder& producers,
                        const std::optional<ShardSpec>& shard) {
  auto& i = *impl_;
  i.wait_teardowns();  // the previous push's
  const auto start = Clock::now();
  if (i.options.receivers.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: no receivers");
  if (tensors.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "push: no tensors");
  // A sharded push sends the blocks it holds and declares its replicas too (docs/sharded.md).
  std::vector<TensorView> sent_blocks;
  {
    std::lock_guard lock(i.mutex);
    if (i.running) fail(FERRY_STATUS_FAILED_PRECONDITION, "push: another push is running");
    i.shard = shard.value_or(ShardSpec{i.options.shard_rank, i.options.shard_world});
  }
  // Whole tensors, into receivers that each take only parts of them: as rank 0 of 1.
  const bool whole = !i.sharded();
  if (whole && i.whole_as_rank) i.shard = ShardSpec{0, 1};
  if (i.sharded()) {
    check_shard_views(tensors, i.shard);
    for (const auto& t : tensors) {
      if (!t.replica) sent_blocks.push_back(t);
    }
    i.declared = tensors;
    tensors = sent_blocks;
  } else {
    for (const auto& t : tensors) {
      if (t.replica || !t.global_shape.empty() || !t.offsets.empty()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "push: tensor '{}' is a block of a global tensor, but the sender is not sharded "
             "(set its rank and world)",
             t.name);
      }
    }
  }
  for (const auto& r : i.options.receivers) parse_address(r);
  // From here on this push owns the kept sessions (i.links).
  {
    std::lock_guard lock(i.mutex);
    if (i.running) fail(FERRY_STATUS_FAILED_PRECONDITION, "push: another push is running");
    i.running = true;
    i.aborted = false;
    i.abort_reason.clear();
    i.results.assign(i.options.receivers.size(), ReceiverResult{});
    for (std::size_t k = 0; k < i.results.size(); ++k) {
      i.results[k].address = i.options.receivers[k];
    }
  }
  struct Running {
    Impl& impl;
    ~Running() {
      std::lock_guard lock(impl.mutex);
      impl.running = false;
    }
  } running{i};
  // The names are unique when they are a kept session's catalog (checked at its first push):
  // a comparison, where a set of names costs ~0.5 ms per 4096 tensors.
  std::vector<std::optional<bool>> same_catalog(i.links.size());
  bool known_names = false;
  for (std::size_t r = 0; r < i.links.size(); ++r) {
    if (!i.links[r]) continue;
    i.links[r]->ask_to_stop();
    same_catalog[r] = i.links[r]->same_catalog(tensors);
    known_names = known_names || *same_catalog[r];
  }
  CheckedTensors checked = check_tensors(tensors, known_names);
  const std::uint64_t total = checked.total;
  const std::string version_label = label.value_or(std::to_string(version));
  // The plan: buckets, manifests encoded once for every receiver (sizes only: no tensor read).
  PushPlan plan = plan_buckets(tensors, std::move(checked), i.options.bucket_bytes);
  const auto catalog_same = [&](std::size_t r) {
    return r < same_catalog.size() ? same_catalog[r] : std::nullopt;
  };
  {
    std::vector<std::size_t> suspended;
    for (std::size_t r = 0; r < i.links.size(); ++r) {
      if (!i.links[r]) continue;
      i.links[r]->stop_watching();  // (asked above) then its fields are this push's to read
      if (i.links[r]->suspended) suspended.push_back(r);
    }
    if (!suspended.empty()) {
      i.for_each_receiver(
          suspended, [&](std::size_t r) { i.rejoin_early(r, tensors, plan, catalog_same(r)); });
    }
  }

  // Nothing reads a tensor before the work that produced it is done (docs/architecture.md, "Stream
  // ordering"): a trainer calls push() right after its optimizer step, whose kernels may still
  // be queued. That work is marked here and waited for by the first read (plan.before_reads:
  // fingerprints, gathering, packing, the copies' launch), so that the sessions' Begin round
  // trips and the queueing of their first copies overlap the producer's kernels.
  std::vector<int> producer_devices;
  for (const auto& t : tensors) {
    if (t.memory_kind == FERRY_MEMORY_CUDA) producer_devices.push_back(t.device);
  }
  order::Pending producers_done(producers, producer_devices,
                                fmt::format("push of version {}", version));
  plan.before_reads = [&producers_done] { producers_done.wait(); };

  // Fingerprints and manifests, side by side with the sessions' set-up (PushPlan::seal), on a
  // thread joined before `plan` goes.
  PlanSealing sealing(plan, tensors, version, version_label, i.options.threads);
  // CUDA tensors may go where the copies fingerprint what they write (the sessions decide);
  // anything else needs the plan's fingerprints, computed from now on (a sharded rank's
  // sessions decide too: each may send only part of the blocks, under a plan of its own).
  if (!plan.cuda_tensors && !i.sharded()) plan.seal();

  const double prepare_s = seconds_since(start);
  // Progress: begin now, end however push() leaves from here on.
  struct ProgressEnds {
    const std::function<void(const PushProgress&)>& progress;
    PushProgress last;
    ~ProgressEnds() {
      if (!progress) return;
      last.event = PushProgress::Event::end;
      try {
        progress(last);
      } catch (...) {
        // A display that fails must not turn a push's outcome into an exception.
      }
    }
  } progress_ends{i.options.progress, {}};
  progress_ends.last.version = version;
  progress_ends.last.receivers = i.options.receivers.size();
  progress_ends.last.bytes_total = plan.bucket_total;
  if (i.options.progress) i.options.progress(progress_ends.last);
  std::vector<std::size_t> every(i.options.receivers.size());
  for (std::size_t r = 0; r < every.size(); ++r) every[r] = r;
  i.for_each_receiver(every, [&](std::size_t r) {
    i.run_receiver(r, tensors, plan, version, version_label, catalog_same(r));
  });
  try {
    sealing.wait();
  } catch (const std::exception& e) {
    // Every receiver saw this failure already; the report says so.
    logger("sender")->warn("push of version {}: fingerprints: {}", version, e.what());
  }

  PushReport report;
  report.version = version;
  report.bytes = total;
  {
    std::lock_guard lock(i.mutex);
    report.receivers = i.results;
  }
  report.seconds = seconds_since(start);
  const double producer_wait_s = producers_done.waited_seconds();
  report.producer_wait_seconds = producer_wait_s;
  if (whole) i.choose_whole_as_rank(report);
  progress_ends.last.all_committed = report.all_committed();
  logger("sender")->debug(
      "push of version {}: {} tensors, {} bytes: waiting for the producers ({}) {:.3f} ms, checks "
      "and buckets {:.3f} ms, fingerprints + manifests {:.3f} ms, total {:.3f} ms (sessions "
      "included)",
      version, tensors.size(), total, order::wait_name(producers.wait), producer_wait_s * 1e3,
      prepare_s * 1e3, sealing.seconds() * 1e3, report.seconds * 1e3);
  return report;
}

void Sender::abort(const std::string& reason) {
  auto& i = *impl_;
  std::lock_guard lock(i.mutex);
  if (!i.running) return;
  i.aborted = true;
  i.abort_reason = reason;
  for (auto* c : i.channels) c->shutdown();
  for (auto* d : i.data_paths) d->abort(reason);
}

std::vector<ReceiverResult> Sender::status() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->results;
}

}  // namespace ferry::session
