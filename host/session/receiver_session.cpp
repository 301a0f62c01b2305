// session/receiver_session.cpp: the receiver's side of one session: handshake, the Begin, and the
// session as a bucket source of the update loop (see session/receiver_session.hpp).
#include "session/receiver_session.hpp"

#include <kj/exception.h>
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>

#include <ferry/kernels/cuda.hpp>
#endif

#include <future>
#include <map>
#include <optional>
#include <vector>

#include "common/log.hpp"
#include "config/config.hpp"
#include "receiver/receiver.hpp"
#include "session/data_path.hpp"
#include "session/device_fingerprints.hpp"
#include "session/holdings.hpp"
#include "session/sharded_update.hpp"
#include "store/store_device.hpp"
#include "update/bucket_source.hpp"

namespace ferry::session {
namespace {

// The staging slots of a rejoined direct session: what the sender's put probe writes
// (session/data_path_plugin.cpp) and no more.
constexpr std::uint64_t kProbeSlotBytes = 256;

using Which = wire::Message::Which;

const char* message_name(Which which) {
  switch (which) {
    case Which::HELLO:
      return "hello";
    case Which::WELCOME:
      return "welcome";
    case Which::REFUSAL:
      return "refusal";
    case Which::BEGIN:
      return "begin";
    case Which::READY:
      return "ready";
    case Which::BUCKET:
      return "bucket";
    case Which::ACK:
      return "ack";
    case Which::COMMIT:
      return "commit";
    case Which::COMMITTED:
      return "committed";
    case Which::ABORT:
      return "abort";
    case Which::CLOSING:
      return "closing";
    case Which::PATH_DROPPED:
      return "path dropped";
    case Which::REJOIN:
      return "rejoin";
    case Which::REJOINED:
      return "rejoined";
    case Which::RESUMED:
      return "resumed";
  }
  return "unknown";
}

[[noreturn]] void unexpected(const Channel& ch, const std::string& phase, Which got) {
  fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected '{}' message", ch.peer(), phase,
       message_name(got));
}

// Fingerprints of the entries of a bucket in device memory of `device`, their kernels side by
// side (session/device_fingerprints.hpp): where the bucket's data holds them, or where they are
// read in place (Bucket::entry_data). Entries were validated against the bucket's size by the
// manifest decoder.
std::vector<std::uint64_t> device_fingerprints(int device, const update::Bucket& bucket,
                                               const manifest::Manifest& m) {
  std::vector<const void*> data;
  std::vector<std::uint64_t> bytes;
  data.reserve(m.tensors.size());
  bytes.reserve(m.tensors.size());
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    data.push_back(bucket.entry_data.empty() ? bucket.data.data() + m.tensors[i].offset
                                             : bucket.entry_data[i]);
    bytes.push_back(m.tensors[i].size);
  }
  return fingerprint_device_ranges(device, data, bytes, fmt::format("bucket {}", m.bucket_index));
}

// One session connection; during an update it is the update loop's bucket source, or one rank
// of a sharded update (session/sharded_update.hpp), whose source calls begun(), verify() and
// applied() of each of its sessions.
class Session final : public update::BucketSource, public ShardMember {
 public:
  Session(Channel& ch, receiver::Receiver& r, const registry::Registry& reg,
          const config::Config& cfg, const ReceiverSessionSettings& st, SessionLink& link)
      : ch_(ch), receiver_(r), registry_(reg), config_(cfg), settings_(st), link_(link) {}

  // A rank of a sharded update stays until that update ended: its loop may still call it.
  ~Session() override {
    if (sharded_) sharded_->leave(rank_);
  }

  void run() {
    handshake();
    if (sharded_) {
      // A rank of sharded updates: one, or one after another through a kept session.
      auto msg = ch_.recv(deadline_in(settings_.bucket_timeout), "begin");
      begin_start_ = Clock::now();
      while (msg) {
        run_sharded(msg->root());
        if (!keep_) return;
        msg = next_begin();
        if (msg) {
          begin_start_ = Clock::now();  // the rejoin is part of this Begin's wait for Ready
          rejoin_shard();
        }
      }
      return;
    }
    auto msg = ch_.recv(deadline_in(settings_.bucket_timeout), "begin");
    while (msg) {
      begin_start_ = Clock::now();  // the Begin arrived: its wait for Ready starts
      begin(msg->root());
      update_and_commit();
      if (!keep_) return;
      msg = next_begin();
    }
  }

  // A kept session's next Begin (next_update()), the Rejoins of a suspended session answered on
  // the way: a rejoined session is idle again until its Begin, which may come much later (the
  // sender rejoins before it waits for its trainer's kernels), and a release meanwhile suspends
  // it again.
  std::unique_ptr<Received> next_begin() {
    auto msg = next_update();
    while (msg && msg->root().which() == Which::REJOIN) {
      rejoin(msg->root().getRejoin());
      msg = next_update();
    }
    return msg;
  }

  // Ends a failed session: waits for the bucket being applied, aborts the update, tells the
  // sender why when the connection still works. Never throws.
  void fail_session(ferry_status_code_t code, const std::string& message) noexcept {
    try {
      // A rank of a sharded update: the whole update fails, every rank's sender is told.
      if (sharded_) sharded_->fail_rank(rank_, code, message);
      // The update loop waited for the bucket being applied, aborted the update and chose the
      // error that caused the failure.
      if (data_) data_->abort(message);
      update_.reset();
      logger("session")->warn("session with {} failed: {}", ch_.peer(), message);
      // Tried even after a connection error (a failed transport connect is PEER_FAILED too); a
      // dead socket fails at once, a stalled peer costs the 1 s send deadline at most.
      if (!apply_refused_ && !ch_.is_shut_down()) send_refusal(code, message);
    } catch (...) {
    }
  }

  // ---- the session as the update loop's bucket source (update/bucket_source.hpp) ----------
  update::Delivery delivery() const override {
    if (!direct_) return update::Delivery::staged;
    return writer_prints_ ? update::Delivery::in_place_writer_prints : update::Delivery::in_place;
  }

  // Staged buckets of two or more slots: bucket k+1 arrives while bucket k is applied.
  bool double_buffered() const override { return !direct_ && data_->slot_count() > 1; }

  // The update began (and in-place writes are declared): the receives are posted and the
  // sender is told Ready. From then on a direct-writing sender writes live parameters.
  void begun() override {
    logger("session")->debug(
        "{}: begin of version {}: Ready {:.3f} ms after the Begin arrived", ch_.peer(), version_,
        std::chrono::duration<double, std::milli>(Clock::now() - begin_start_).count());
    for (std::uint32_t s = 0; s < data_->slot_count() && s < bucket_count_; ++s) {
      data_->post(s, s, deadline_in(settings_.bucket_timeout));
    }
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Message>().initReady().setVersion(version_);
    ch_.send(m, deadline_in(settings_.bucket_timeout), "begin");
  }

  bool next(std::uint32_t, update::Bucket& out) override;
  void verify(update::Bucket& bucket) override;
  // Reads in place: the bucket's entries mapped where the sender lent them (one key each).
  void map_sources(capnp::List<capnp::Data>::Reader sources, update::Bucket& out,
                   const std::string& phase);
  // Reads in place: the entries' fingerprints for the Ack (the manifest's, which the update
  // engine compares with what it reads before it writes anything).
  void verify_read(update::Bucket& bucket);
  void applied(const update::Bucket& bucket) override;

  // Tell the sender now (it may be waiting for an ack, not sending), then break the wait of the
  // loop's next(); fail_session() reports the error.
  void apply_failed(const Error& error) noexcept override { stop(error.code(), error.what()); }

  // ---- a rank of a sharded update (ShardMember) ---------------------------------------------
  void stop(ferry_status_code_t code, const std::string& message) noexcept override {
    if (apply_refused_.exchange(true)) return;
    send_refusal(code, message);
    ch_.shutdown();
  }
  void check_complete() override { declared_.check_complete(); }
  const std::vector<std::uint64_t>& commit_prints() const override { return commit_prints_; }
  const std::vector<std::vector<std::uint64_t>>& commit_chunks() const override {
    return commit_chunks_;
  }

  update::UpdateEnd end() override {
    update::UpdateEnd out;
    if (prints_at_commit_) {
      out.writer_fingerprints = std::move(commit_prints_);
      out.writer_chunk_hashes = std::move(commit_chunks_);
    }
    return out;
  }

 private:
  void send_refusal(ferry_status_code_t code, const std::string& message) noexcept {
    try {
      capnp::MallocMessageBuilder m;
      auto refusal = m.initRoot<wire::Message>().initRefusal();
      refusal.setCode(static_cast<std::uint32_t>(code));
      refusal.setMessage(message);
      ch_.send(m, deadline_in(std::chrono::milliseconds(1000)), "refusal");
    } catch (...) {
    }
  }

  void handshake() {
    const std::string phase = "handshake (hello)";
    auto msg = ch_.recv(deadline_in(settings_.hello_timeout), phase);
    auto root = msg->root();
    if (root.which() != Which::HELLO) unexpected(ch_, phase, root.which());
    auto hello = root.getHello();
    if (hello.getProtocolVersion() != wire::PROTOCOL_VERSION) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "{}: {}: protocol version {} is not supported (this receiver speaks {})", ch_.peer(),
           phase, hello.getProtocolVersion(), wire::PROTOCOL_VERSION);
    }
    if (!settings_.token.empty() && text(hello.getToken()) != settings_.token) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{}: {}: the session needs the receiver's control API token", ch_.peer(), phase);
    }
    sender_ = text(hello.getSenderName());
    // The catalog, kept for the session's later updates: the names must stay alive (and in
    // place) while descs point at them.
    auto tensors = hello.getTensors();
    auto& names = names_;
    names.reserve(tensors.size());
    auto& descs = descs_;
    descs.reserve(tensors.size());
    for (auto t : tensors) names.push_back(text(t.getName()));
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      auto t = tensors[static_cast<unsigned>(i)];
      ferry_tensor_desc_t d{};
      d.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape);
      d.name = names[i].c_str();
      const auto dtype = t.getDtype();
      if (dtype == 0 || dtype > FERRY_DTYPE_F8_E5M2) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: tensor '{}' has unknown dtype {}", ch_.peer(),
             phase, names[i], dtype);
      }
      d.dtype = static_cast<ferry_dtype_t>(dtype);
      auto shape = t.getShape();
      if (shape.size() > FERRY_MAX_DIMS) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: tensor '{}' has {} dims (at most {})", ch_.peer(),
             phase, names[i], shape.size(), FERRY_MAX_DIMS);
      }
      d.ndim = shape.size();
      for (unsigned k = 0; k < shape.size(); ++k) d.shape[k] = shape[k];
      descs.push_back(d);
    }
    const auto open_start = Clock::now();
    config_json_ = text(hello.getConfigJson());
    if (hello.hasShard()) {
      read_shard(hello.getShard(), phase);
    } else {
      try {
        update_ = receiver_.open_session(descs, config_json_, nullptr, lock_wait());
      } catch (const Error& e) {
        fail(e.code(), "{}: layout check refused: {}", ch_.peer(), e.what());
      }
      epoch_ = update_->memory_epoch();
    }
    keep_ = settings_.keep_sessions && hello.getKeepSession();
    // A kept rank of sharded updates is suspended by a release too: it rejoins (rejoin()), then
    // joins its next update at the Begin (rejoin_shard()).
    link_.set_rejoinable(keep_ && hello.getRejoinAfterRelease(),
                         keep_ && hello.getRejoinAfterRelease() && hello.getRejoinsWhenResumed());

    const auto path_start = Clock::now();
    capacity_ = hello.getBucketBytes();
    const std::uint32_t slots = hello.getSlots();
    if (capacity_ == 0 || capacity_ > settings_.max_bucket_bytes) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "{}: {}: staging slots of {} bytes refused (1 .. {} allowed)", ch_.peer(), phase,
           capacity_, settings_.max_bucket_bytes);
    }
    if (slots < 1 || slots > 4) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {}: {} staging slots refused (1 .. 4 allowed)",
           ch_.peer(), phase, slots);
    }
    slots_ = slots;
    const std::string wanted = text(hello.getTransport());
    if (wanted != "inline") {
      try {
        make_data_path(wanted, hello.getTransportAddress());
      } catch (const Error& e) {
        data_.reset();
        if (hello.getTransportRequired()) {
          fail(e.code(), "{}: {}: transport '{}' unavailable here: {}", ch_.peer(), phase, wanted,
               e.what());
        }
        logger("session")->warn("session with {}: transport '{}' unavailable ({}); using inline",
                                ch_.peer(), wanted, e.what());
      }
    }
    if (!data_) data_ = make_inline_receiver_path(capacity_, slots);
    const auto offer_start = Clock::now();
    delivery_ = text(hello.getDelivery());
    lends_ = !hello.hasShard() && hello.getLendsTensors();
    if (!hello.hasShard()) {
      offer_direct(delivery_, descs);
      offer_reads();
      offer_pieces(descs);
    }
    if (hello.hasShard()) {
      join_shard(wants_direct_blocks());
      offer_direct_blocks();
    }
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    logger("session")->debug(
        "{}: handshake: layout check {:.3f} ms, data path {:.3f} ms, direct offer {:.3f} ms",
        ch_.peer(), ms(open_start, path_start), ms(path_start, offer_start),
        ms(offer_start, Clock::now()));

    capnp::MallocMessageBuilder m;
    auto welcome = m.initRoot<wire::Message>().initWelcome();
    welcome.setProtocolVersion(wire::PROTOCOL_VERSION);
    welcome.setReceiverName(settings_.name);
    welcome.setLayoutSignature(sharded_ ? sharded_->layout_signature()
                                        : update_->layout_signature());
    welcome.setNumParams(sharded_ ? sharded_->num_params()
                                  : static_cast<std::uint32_t>(update_->num_params()));
    welcome.setSharded(sharded_ != nullptr);
    if (sharded_ && sends_needs_) {
      auto needs = welcome.initNeeds(static_cast<unsigned>(pieces_->size()));
      for (unsigned i = 0; i < pieces_->size(); ++i) {
        const Holding& p = (*pieces_)[i];
        const auto dims = static_cast<unsigned>(p.extents.size());
        auto offsets = needs[i].initOffsets(dims);
        auto extents = needs[i].initExtents(dims);
        for (unsigned d = 0; d < dims; ++d) {
          offsets.set(d, p.offsets[d]);
          extents.set(d, p.extents[d]);
        }
        needs[i].setNone(!p.sent);
      }
    }
    describe_data_path(welcome);
    transport_ = data_->name();
    welcome.setBucketTimeoutMs(static_cast<std::uint64_t>(settings_.bucket_timeout.count()));
    welcome.setCommitTimeoutMs(static_cast<std::uint64_t>(settings_.commit_timeout.count()));
    welcome.setKeepSession(keep_);
    welcome.setFingerprintsAtCommit(true);
    welcome.setReadsTensors(reads_offered_);
    welcome.setTakesPieces(takes_pieces_);
    ch_.send(m, deadline_in(settings_.hello_timeout), "handshake (welcome)");
    logger("session")->info(
        "session with {} ({}): layout accepted, {} parameters, data path {}{}", ch_.peer(), sender_,
        sharded_ ? sharded_->num_params() : update_->num_params(), data_->name(),
        destinations_.empty()
            ? std::string()
            : fmt::format(", direct delivery offered ({} shared regions)", region_keys_.size()));
  }

  // The bytes of each staging slot a data path gets: the Hello's bucket capacity, but for the
  // rejoin of a session that delivered directly, whose slots are never written (they went after
  // its first commit), the few bytes of the sender's put probe.
  std::uint64_t slot_bytes() const {
    return delivered_directly_ ? std::min<std::uint64_t>(capacity_, kProbeSlotBytes) : capacity_;
  }

  // The data path of transport plugin `transport`, connected to the sender's `address`. Device
  // transports get staging slots on the GPU the weights are on: an embedded receiver's
  // registered parameters decide, not the receiver.device default.
  void make_data_path(const std::string& transport, capnp::Data::Reader address) {
    device_ = receiver_.weights_cuda_device();
    data_ = make_plugin_receiver_path(registry_, config_, transport, slot_bytes(), slots_, device_);
    data_->connect(std::span<const std::uint8_t>(address.begin(), address.size()), ch_.peer(),
                   deadline_in(settings_.hello_timeout));
  }

  // What the sender needs of the data path (a Welcome, or a Rejoined): transport, address, slot
  // keys, and the shared regions with a destination per tensor where direct delivery is offered.
  template <typename Builder>
  void describe_data_path(Builder out) {
    out.setTransport(data_->name());
    const auto address = data_->address();
    out.setTransportAddress(kj::arrayPtr(address.data(), address.size()));
    auto slot_list = out.initSlots(slots_);
    for (std::uint32_t i = 0; i < slots_; ++i) {
      slot_list[i].setCapacity(slot_bytes());
      const auto key = data_->slot_key(i);
      slot_list[i].setRemoteKey(kj::arrayPtr(key.data(), key.size()));
    }
    out.setRmaNative(data_->rma_native());
    if (!destinations_.empty()) {
      auto regions = out.initRegions(static_cast<unsigned>(region_keys_.size()));
      for (unsigned i = 0; i < region_keys_.size(); ++i) {
        regions.set(i, kj::arrayPtr(region_keys_[i].data(), region_keys_[i].size()));
      }
      auto list = out.initDestinations(static_cast<unsigned>(destinations_.size()));
      for (unsigned i = 0; i < destinations_.size(); ++i) {
        list[i].setRegion(destinations_[i].region);
        list[i].setOffset(destinations_[i].offset);
        if (destinations_[i].chunk_base && destinations_[i].chunk_head > 0) {
          list[i].setChunkHashesAfterHead(true);
          list[i].setChunkHead(destinations_[i].chunk_head);
          list[i].setChunkBase(*destinations_[i].chunk_base);
        } else if (destinations_[i].chunk_base) {
          list[i].setChunkHashes(true);
          list[i].setChunkBase(*destinations_[i].chunk_base);
        }
      }
    }
  }

  // A suspended session's next update (Closing.suspend, then the sender's Rejoin): under the
  // update lock, the memory back, a new data path and the memory shared again, told in the
  // Rejoined; then the session is idle until its Begin, which takes the lock again and checks
  // that the memory epoch noted here is unchanged (reopen; a rank of sharded updates: its
  // update, rejoin_shard). A release in between suspends the session again. The catalog, layout
  // and delivery the handshake settled stay. A rank of sharded updates takes no lock here (its
  // update takes it when every rank joined): it notes the memory epoch before it shares the
  // memory, so a release that overlaps the rejoin fails its Begin before its sender may write.
  void rejoin(wire::Rejoin::Reader r) {
    const std::string phase = "rejoin";
    const auto start = Clock::now();
    if (data_) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: the session was not suspended", ch_.peer(), phase);
    }
    // The memory is what the receiver resumed; the session may write it until the next release.
    if (sharded_) {
      epoch_ = receiver_.memory_epoch();
    } else {
      reopen(phase, true);
      epoch_ = update_->memory_epoch();
    }
    // Its weights must be back: a rejoin shares them again.
    for (const auto& t : receiver_.memory_state()) {
      if (t.released && t.tag == "weights") {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "{}: {}: the receiver's '{}' memory is released (resume_memory_occupation first)",
             ch_.peer(), phase, t.tag);
      }
    }
    const auto path_start = Clock::now();
    if (transport_ == "inline") {
      data_ = make_inline_receiver_path(slot_bytes(), slots_);
    } else {
      make_data_path(transport_, r.getTransportAddress());
    }
    const auto offer_start = Clock::now();
    if (sharded_) {
      offer_direct_blocks();
    } else {
      offer_direct(delivery_, descs_);
      offer_reads();
    }
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    logger("session")->debug(
        "{}: rejoin: lock and checks {:.3f} ms, data path {:.3f} ms, direct "
        "offer {:.3f} ms",
        ch_.peer(), ms(start, path_start), ms(path_start, offer_start),
        ms(offer_start, Clock::now()));
    capnp::MallocMessageBuilder m;
    describe_data_path(m.initRoot<wire::Message>().initRejoined());
    ch_.send(m, deadline_in(settings_.bucket_timeout), phase);
    // Idle from here, then the lock goes (as after a commit: the Rejoined is out first).
    link_.set_idle();
    update_.reset();
    logger("session")->info(
        "kept session with {} rejoined after the release: data path {}{} in {:.3f} ms", ch_.peer(),
        data_->name(),
        destinations_.empty()
            ? std::string()
            : fmt::format(", direct delivery ({} shared regions)", region_keys_.size()),
        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }

  // The release hook asked this kept session to suspend and its sender dropped its data path
  // (pathDropped): the session's own goes too (its registrations and exports of the memory
  // about to be released, its staging slots), then the hook may release.
  void drop_data_path() {
    data_.reset();
    region_keys_.clear();
    destinations_.clear();
    delivered_directly_ = delivered_directly_ || slots_released_;
    slots_released_ = false;
    link_.set_suspended();
    logger("session")->debug("kept session with {} suspended for the release", ch_.peer());
  }

  // Direct delivery (docs/architecture.md, "Three ways to deliver"): offered when the data path
  // puts into device memory and every tensor's plan is one whole copy into a device parameter; the
  // memory blocks holding those parameters are shared with the sender. Anything less: staged.
  void offer_direct(const std::string& delivery, std::span<const ferry_tensor_desc_t> descs) {
    if (delivery == "staged" || !data_->rma_native() || data_->slot_kind() != FERRY_MEMORY_CUDA ||
        descs.empty()) {
      return;
    }
    const auto dests = update_->direct_destinations(descs);
    std::string why_not;
    for (std::size_t i = 0; i < dests.size() && why_not.empty(); ++i) {
      if (!dests[i]) why_not = fmt::format("tensor '{}' needs its plan applied", descs[i].name);
    }
    if (why_not.empty()) {
      std::vector<update::UpdateEngine::DirectDestination> present;
      present.reserve(dests.size());
      for (const auto& d : dests) present.push_back(*d);
      why_not = share_destinations(present);
      if (why_not.empty()) return;
    }
    logger("session")->info("session with {}: staged delivery ({})", ch_.peer(), why_not);
  }

  // Reads in place (docs/architecture.md, "Three ways to deliver"): offered where direct
  // delivery is not (some tensor's plan is not one whole copy into a device parameter), the
  // sender lends its tensors and the data path maps them here; update.delivery "staged" keeps
  // the staging slots. The Begin then says whether an update reads.
  void offer_reads() {
    reads_offered_ =
        lends_ && destinations_.empty() && delivery_ != "staged" && data_->reads_peer_memory();
    if (reads_offered_) {
      logger("session")->info(
          "session with {}: reads the sender's tensors in place and applies "
          "the plan from them",
          ch_.peer());
    }
  }

  // Welcome.takesPieces, to a sender of one whole catalog: where direct delivery of whole
  // tensors is not offered, this receiver assembles sharded updates, and its plan reads only part
  // of some tensor (a tensor-parallel rank), a 1-rank sharded push would send it only the parts
  // it reads (ShardedUpdate::needed_piece of whole blocks). Where this session writes or reads
  // in place, only if every part then lands as one contiguous copy in a device parameter
  // (block_destinations): a part that would be staged is slower than reading in place.
  void offer_pieces(std::span<const ferry_tensor_desc_t> descs) {
    takes_pieces_ = false;
    if (!settings_.sharded || !destinations_.empty() || delivery_ == "staged" || descs.empty()) {
      return;
    }
    std::map<std::string, update::TensorReads> reads;
    try {
      const auto r = update_->reads(descs);
      for (std::size_t i = 0; i < r.size() && i < descs.size(); ++i) {
        reads.emplace(descs[i].name, r[i]);
      }
    } catch (const Error&) {
      return;  // the plan cannot say what it reads: whole tensors
    }
    std::vector<Holding> pieces;  // (reserved: the blocks' spans point into them)
    std::vector<update::UpdateEngine::BlockRef> blocks;
    pieces.reserve(descs.size());
    bool part = false;
    for (std::uint32_t i = 0; i < descs.size(); ++i) {
      Holding whole;
      whole.tensor = descs[i].name;
      whole.extents.assign(descs[i].shape, descs[i].shape + descs[i].ndim);
      whole.offsets.assign(descs[i].ndim, 0);
      pieces.push_back(ShardedUpdate::needed_piece(reads, whole));
      const Holding& p = pieces.back();
      part = part || !p.sent || p.extents != whole.extents;
      if (p.sent) blocks.push_back({i, p.offsets, p.extents});
    }
    if (!part) return;
    if (reads_offered_ || wants_direct_blocks()) {
      const auto dests = update_->block_destinations(descs, blocks);
      for (const auto& d : dests) {
        if (!d) return;
      }
    }
    takes_pieces_ = true;
    logger("session")->info(
        "session with {}: its plan reads only part of some tensors; a 1-rank sharded push would "
        "send it only those parts",
        ch_.peer());
  }

  // Whether the receiver takes the writing copies' fingerprints as those of what they wrote
  // (update.direct_verify = "writer"): only then does a piece starting inside a chunk get the
  // chunk hashes of its part after that chunk (the part before is not fingerprinted apart).
  bool trusts_writer_prints() const {
    return config_.update.direct_verify == config::DirectVerify::writer;
  }

  // Shares the memory blocks holding `dests` with the sender (one region per block) and sets
  // the Welcome's regions and per-tensor destinations; the data path's refusal, else "".
  std::string share_destinations(std::span<const update::UpdateEngine::DirectDestination> dests) {
    try {
      std::map<const std::byte*, std::uint32_t> region_of;  // block base -> region index
      std::vector<SharedDestination> destinations;
      std::vector<std::vector<std::uint8_t>> keys;
      for (const auto& d : dests) {
        auto [it, added] = region_of.emplace(d.block, static_cast<std::uint32_t>(keys.size()));
        if (added) keys.push_back(data_->share_region(d.block, d.block_bytes));
        // A piece of a parameter on a chunk boundary: its chunk hashes make the parameter's
        // fingerprint with the other pieces' (UpdateEngine::attach_direct_fingerprints).
        // A piece that starts inside a chunk: the hashes of its part from the next chunk boundary
        // on, where the writing copies' fingerprints are taken as the receiver's own (the part
        // before is read again at commit, as where two pieces meet).
        constexpr std::uint64_t C = kernels::kFingerprintChunkBytes;
        const bool piece = d.param_offset != 0 || d.bytes != d.param_bytes;
        const std::uint64_t head = (C - d.param_offset % C) % C;
        std::optional<std::uint64_t> chunk_base;
        if (piece && (head == 0 || (trusts_writer_prints() && head < d.bytes))) {
          chunk_base = (d.param_offset + head) / C;
        }
        destinations.push_back({it->second, static_cast<std::uint64_t>(d.data - d.block),
                                chunk_base, chunk_base ? head : 0});
      }
      region_keys_ = std::move(keys);
      destinations_ = std::move(destinations);
      return {};
    } catch (const Error& e) {
      return e.what();
    }
  }

  // Direct delivery of a rank's blocks (a sharded update): offered when the data path puts into
  // device memory and every piece the rank sends (its holdings' pieces in Hello order, replicas
  // and empty pieces left out: the sender's tensors) lands as one contiguous copy in a device
  // parameter (ShardedUpdate::places: a range of rows of a whole copy, a tensor-parallel rank's
  // rows or columns of a weight it keeps whole). Anything less: staged. As for one sender, unless
  // the sender asks for staged delivery (update.delivery = "staged").
  void offer_direct_blocks() {
    if (!wants_direct_blocks() || !holdings_ || holdings_->empty()) return;
    // The handshake's update placed the pieces; later updates take its plan over without
    // placing them again, and the places outlive a release (the addresses stay on resume).
    if (!block_places_) block_places_ = sharded_->places(rank_);
    const auto& places = *block_places_;
    std::string why_not;
    std::vector<update::UpdateEngine::DirectDestination> dests;
    for (std::size_t k = 0; k < pieces_->size(); ++k) {
      const Holding& h = (*pieces_)[k];
      if (!h.sent) continue;
      if (k >= places.size() || !places[k]) {
        why_not = fmt::format(
            "tensor '{}': the block {} is not one contiguous copy into a "
            "device parameter",
            h.tensor, block_text(h.offsets, h.extents));
        break;
      }
      dests.push_back(*places[k]);
    }
    if (why_not.empty() && dests.empty()) why_not = "it sends no block";
    if (why_not.empty()) why_not = share_destinations(dests);
    if (why_not.empty()) return;
    logger("session")->info("session with {} (rank {}): staged delivery ({})", ch_.peer(), rank_,
                            why_not);
  }

  // Whether this rank's session offers direct delivery where it can (offer_direct_blocks()).
  bool wants_direct_blocks() const {
    return delivery_ != "staged" && data_->rma_native() && data_->slot_kind() == FERRY_MEMORY_CUDA;
  }

  // A kept session between updates: the sender's next Begin, or nullptr when the session ends
  // (the sender closed it, it stayed idle past its limit, or the receiver is closing it).
  std::unique_ptr<Received> next_update() {
    std::unique_ptr<Received> msg;
    const auto idle_end = deadline_in(settings_.idle_timeout);
    for (;;) {
      try {
        msg = ch_.recv(idle_end, "between updates");
      } catch (const Error& e) {
        if (e.code() == FERRY_STATUS_TIMEOUT) {
          logger("session")->info("kept session with {} ends: no update for {} s", ch_.peer(),
                                  settings_.idle_timeout.count() / 1000);
        } else {
          logger("session")->debug("kept session with {} ends: {}", ch_.peer(), e.what());
        }
        return nullptr;
      }
      if (msg->root().which() != Which::PATH_DROPPED) break;
      if (!link_.suspending()) {
        logger("session")->warn("kept session with {} ends: 'path dropped' unasked", ch_.peer());
        return nullptr;
      }
      drop_data_path();
    }
    if (!link_.leave_idle()) {
      // This message crossed the Closing: the sender drops the session when it reads that.
      logger("session")->info("kept session with {} ends: the receiver closed it", ch_.peer());
      return nullptr;
    }
    if (msg->root().which() == Which::ABORT) {
      logger("session")->debug("kept session with {} ends: {}", ch_.peer(),
                               text(msg->root().getAbort().getReason()));
      return nullptr;
    }
    return msg;
  }

  // How long a handshake, a kept session's Begin or a rejoin waits for the update lock before it
  // is refused (`another update is in progress`). Senders rejoin when the receiver resumes, each
  // on its own thread (taking the lock for a few milliseconds), right when trainers push: a
  // brief holder is waited for, a running update longer than this is not.
  std::chrono::milliseconds lock_wait() const { return settings_.hello_timeout / 2; }

  // A later update of a kept session takes the update lock again and checks that the memory
  // shared in the handshake or the last rejoin is still what the receiver's parameters live in.
  // (A rejoin shares the memory again: no check.)
  void reopen(const std::string& phase, bool rejoining = false) {
    try {
      if (catalog_key_.empty()) catalog_key_ = manifest::catalog_key(descs_);
      update_ = receiver_.open_session(descs_, config_json_, &catalog_key_, lock_wait());
    } catch (const Error& e) {
      fail(e.code(), "{}: {}: {}", ch_.peer(), phase, e.what());
    }
    // A session that reads in place shared nothing: the memory it writes is this receiver's own,
    // through its update engine (which refuses a released tag).
    if (!rejoining && !link_.shares_nothing() && update_->memory_epoch() != epoch_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{}: {}: the receiver's memory was released or resumed since this session "
           "shared it; the session ends (the sender opens a new one)",
           ch_.peer(), phase);
    }
    epoch_ = update_->memory_epoch();
  }

  void begin(wire::Message::Reader root) {
    const std::string phase = "begin";
    if (root.which() == Which::ABORT) {
      fail(FERRY_STATUS_ABORTED, "{}: the sender aborted before begin: {}", ch_.peer(),
           text(root.getAbort().getReason()));
    }
    if (root.which() != Which::BEGIN) unexpected(ch_, phase, root.which());
    if (!data_) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: the session was suspended and not rejoined",
           ch_.peer(), phase);
    }
    if (!update_) reopen(phase);
    auto b = root.getBegin();
    version_ = b.getVersion();
    bucket_count_ = b.getBucketCount();
    const std::string label = text(b.getLabel());
    if (b.getViaPut() && !data_->rma_native()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: buckets announced by put, but no slot key was given",
           ch_.peer(), phase);
    }
    data_->set_via_put(b.getViaPut());
    direct_ = b.getDirect();
    if (direct_ && (destinations_.empty() || !b.getViaPut())) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: direct delivery announced, but none was offered",
           ch_.peer(), phase);
    }
    reads_ = b.getReadsTensors();
    refuse_staged_without_slots(phase);
    if (reads_ && (!reads_offered_ || direct_)) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: reads in place announced, but none was offered",
           ch_.peer(), phase);
    }
    prints_at_commit_ = b.getFingerprintsAtCommit();
    if (prints_at_commit_ && !(direct_ && b.getWriterFingerprints())) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {}: fingerprints at commit announced without direct delivery by fingerprinting "
           "copies",
           ch_.peer(), phase);
    }
    writer_prints_ = b.getWriterFingerprints();
    label_ = label.empty() ? std::nullopt : std::optional<std::string>(label);
    next_ = 0;
  }

  // A Begin that stages in a session that delivered directly or read in place: its staging
  // slots are gone.
  void refuse_staged_without_slots(const std::string& phase) const {
    if ((slots_released_ || delivered_directly_) && !direct_ && !reads_) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {}: staged delivery announced in a session that delivered directly or read in "
           "place (its staging slots are gone)",
           ch_.peer(), phase);
    }
  }

  // Runs the update that began through the update loop, with this session as its source, then
  // tells the sender Committed.
  void update_and_commit() {
    const auto report = update_->run(*this, version_, label_);
    logger("session")->debug(
        "{}: commit of version {}: {:.3f} ms (coverage, fingerprints of every parameter "
        "and of what was written in place, publish)",
        ch_.peer(), version_,
        std::chrono::duration<double, std::milli>(Clock::now() - commit_start_).count());
    logger("receiver")
        ->info("update {} ('{}') from a session: {} buckets, {:.1f} MiB in {:.3f} s",
               report.version.number, report.version.label, report.buckets,
               report.bytes / 1048576.0, report.seconds);
    capnp::MallocMessageBuilder m;
    auto c = m.initRoot<wire::Message>().initCommitted();
    c.setVersion(report.version.number);
    c.setLabel(report.version.label);
    c.setSeconds(report.seconds);
    ch_.send(m, deadline_in(settings_.commit_timeout), "commit (committed)");
    // A kept session that read in place reads in place for good (its sender's tensors stay CUDA
    // memory while it is kept): its staging slots go, and it shares nothing of this receiver's
    // memory from here, so a release leaves it, and the sender's tensors it mapped, as they are.
    // Before it is idle: the release hook must see it so.
    if (keep_ && reads_ && !slots_released_) {
      data_->release_slots();
      slots_released_ = true;
      link_.set_shares_nothing();
    }
    // Idle from here (a kept session), then the update lock goes: a release of the
    // receiver's memory, which takes that lock, finds this session idle and suspends or closes
    // it (one that shares nothing stays). Not before the Committed is out: a Closing must never
    // overtake it.
    if (keep_) link_.set_idle();
    update_.reset();
    // Direct delivery is the session's for good (the handshake decided): a kept session
    // needs no staging slots, and their memory is the engine's again.
    if (keep_ && direct_) {
      data_->release_slots();
      slots_released_ = true;
    }
  }

  // ---- a rank of a sharded update ----------------------------------------------------------
  // The Hello's holdings (Hello.shard): blocks of its tensors, in global coordinates.
  void read_shard(wire::ShardHello::Reader shard, const std::string& phase) {
    if (!settings_.sharded) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "{}: {}: this receiver does not assemble sharded updates",
           ch_.peer(), phase);
    }
    rank_ = shard.getRank();
    world_ = shard.getWorld();
    holdings_ = std::make_shared<const std::vector<Holding>>(
        read_holdings(shard, descs_, fmt::format("{}: {}", ch_.peer(), phase)));
    sends_needs_ = shard.getSendsNeeds();
  }

  // Joins the update being assembled and waits until every rank joined and the layout was
  // checked (the Welcome follows).
  void join_shard(bool wants_direct) {
    ShardJoin join;
    join.rank = rank_;
    join.world = world_;
    join.holdings = holdings_;
    join.config_json = config_json_;
    join.peer = fmt::format("{} ({})", ch_.peer(), sender_);
    join.member = this;
    join.sends_needs = sends_needs_;
    join.wants_direct = wants_direct;
    sharded_ = settings_.sharded->join(std::move(join));
    sharded_->wait_welcomed();
    epoch_ = sharded_->memory_epoch();
    // A sender that sends only what this receiver needs (Hello.shard.sendsNeeds) sends, of each
    // block, the piece the plan reads (Welcome.needs); the others send their blocks whole.
    // The same pieces as the update before (its plan taken over) keep their declared blocks.
    auto pieces = sharded_->pieces(rank_);
    if (pieces != pieces_) {
      pieces_ = std::move(pieces);
      declared_ = DeclaredBlocks(rank_, *pieces_);
    } else {
      declared_.reset();
    }
  }

  // A kept rank's next update (its Begin arrived): leaves the last one and joins the update
  // being assembled with the holdings of its Hello; the memory it shared in the handshake or its
  // last rejoin must still be the receiver's parameters (no release or resume since).
  void rejoin_shard() {
    // The update left stays alive until the next one is formed: that one takes its plan over
    // (ShardedUpdate::Plan) when the ranks join alike, also when this rank is the only one.
    const auto left = std::move(sharded_);
    left->leave(rank_);
    const auto epoch = epoch_;
    const auto pieces = pieces_;
    join_shard(false);  // the destinations shared in the handshake stay
    if (sharded_->memory_epoch() != epoch) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{}: begin: the receiver's memory was released or resumed since this session "
           "shared it; the session ends (the sender opens a new one)",
           ch_.peer());
    }
    if (pieces != pieces_ && !same_pieces(*pieces, *pieces_)) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{}: begin: this receiver needs other parts of the rank's blocks than it told the "
           "sender in the handshake; the session ends (the sender opens a new one)",
           ch_.peer());
    }
  }

  static bool same_pieces(const std::vector<Holding>& a, const std::vector<Holding>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i].sent != b[i].sent || a[i].offsets != b[i].offsets || a[i].extents != b[i].extents) {
        return false;
      }
    }
    return true;
  }

  // The Begin (`root`), then this rank's buckets handed to the sharded update as they arrive,
  // then its Commit; Committed once the whole update committed; a kept session then goes idle.
  void run_sharded(wire::Message::Reader root) {
    if (root.which() == Which::ABORT) {
      fail(FERRY_STATUS_ABORTED, "{}: the sender aborted before begin: {}", ch_.peer(),
           text(root.getAbort().getReason()));
    }
    if (root.which() != Which::BEGIN) unexpected(ch_, "begin", root.which());
    if (!data_) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: begin: the session was suspended and not rejoined",
           ch_.peer());
    }
    auto b = root.getBegin();
    if (b.getViaPut() && !data_->rma_native()) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: begin: buckets announced by put, but no slot key was given", ch_.peer());
    }
    data_->set_via_put(b.getViaPut());
    direct_ = b.getDirect();
    if (direct_ && (destinations_.empty() || !b.getViaPut())) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: begin: direct delivery announced, but none was offered",
           ch_.peer());
    }
    refuse_staged_without_slots("begin");
    writer_prints_ = b.getWriterFingerprints();
    prints_at_commit_ = b.getFingerprintsAtCommit();
    if (prints_at_commit_ && !(direct_ && writer_prints_)) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: begin: fingerprints at commit announced without direct delivery by fingerprinting "
           "copies",
           ch_.peer());
    }
    version_ = b.getVersion();
    bucket_count_ = b.getBucketCount();
    next_ = 0;
    sharded_->begin(rank_, version_, text(b.getLabel()), bucket_count_,
                    RankDelivery{direct_, writer_prints_, prints_at_commit_});
    const std::uint32_t slots = data_->slot_count();
    for (;;) {
      // next() posts the receive of the slot freed by the bucket `slots` before this one (a
      // rank writing in place uses no slot: its buckets are only recorded).
      const std::uint32_t k = next_;
      if (!direct_ && slots == 1 && k >= 1) sharded_->wait_applied(rank_, k);
      if (!direct_ && slots >= 2 && k >= 2) sharded_->wait_applied(rank_, k - 1);
      update::Bucket bucket;
      if (!next(0, bucket)) break;
      sharded_->offer(rank_, std::move(bucket));
    }
    send_committed(ch_, sharded_->finish(rank_), deadline_in(settings_.commit_timeout));
    // Idle before the update lock goes (settled()): a release then finds this session and
    // suspends it, so that no sender keeps memory being released mapped.
    if (keep_) link_.set_idle();
    sharded_->settled(rank_);
    // A kept rank that writes in place needs no staging slots (as one sender's session): their
    // memory is the engine's again, and a rejoin gets probe-sized ones.
    if (keep_ && direct_) {
      data_->release_slots();
      slots_released_ = true;
    }
  }

  void send_ack(std::uint32_t index, std::uint32_t slot, const std::vector<std::uint64_t>& prints,
                const std::string& phase) {
    capnp::MallocMessageBuilder m;
    auto ack = m.initRoot<wire::Message>().initAck();
    ack.setIndex(index);
    ack.setSlot(slot);
    auto list = ack.initFingerprints(static_cast<unsigned>(prints.size()));
    for (unsigned i = 0; i < prints.size(); ++i) list.set(i, prints[i]);
    ch_.send(m, deadline_in(settings_.bucket_timeout), phase + " (ack)");
  }

  Channel& ch_;
  receiver::Receiver& receiver_;
  const registry::Registry& registry_;
  const config::Config& config_;
  const ReceiverSessionSettings& settings_;
  SessionLink& link_;
  std::string sender_;
  // The Hello's catalog and config.json (a kept session's later updates check them again).
  std::vector<std::string> names_;
  std::vector<ferry_tensor_desc_t> descs_;  // names point into names_
  std::string config_json_;
  std::string catalog_key_;  // manifest::catalog_key(descs_), made at the first reopen
  bool keep_ = false;        // kept after each commit (both sides agreed)
  // What the handshake settled that a rejoin makes again: the data path's transport ("inline"
  // or the plugin's name), its slots, the Hello's delivery.
  std::string transport_;
  std::uint32_t slots_ = 0;
  std::string delivery_;
  bool delivered_directly_ = false;  // suspended after delivering directly (slot_bytes())
  std::uint64_t epoch_ = 0;  // the receiver's memory epoch at the handshake or the last rejoin
  // A rank of sharded updates: where each of its pieces goes in place (the handshake's update's
  // places(), kept for a rejoin's offer); unset until offered.
  std::optional<std::vector<std::optional<update::UpdateEngine::DirectDestination>>> block_places_;
  std::unique_ptr<receiver::Receiver::StreamingUpdate> update_;
  std::unique_ptr<ReceiverDataPath> data_;
  int device_ = -1;  // the GPU of the data path's device slots; -1: host slots
  std::uint64_t capacity_ = 0;
  std::uint64_t version_ = 0;
  std::uint32_t bucket_count_ = 0;
  std::optional<std::string> label_;          // the Begin's (none: the version number)
  bool writer_prints_ = false;                // Begin.writerFingerprints
  std::uint32_t next_ = 0;                    // the bucket next() expects
  std::uint32_t last_slot_ = 0;               // the slot of the bucket next() handed out last
  std::vector<std::uint64_t> commit_prints_;  // the Commit's writer fingerprints
  std::vector<std::vector<std::uint64_t>> commit_chunks_;  // ... and chunk hashes (may be empty)
  Clock::time_point begin_start_{};
  Clock::time_point commit_start_{};
  // verify() -> applied() of the bucket being applied (one at a time): the ack fingerprints'
  // cost, whether they were the manifest's, when the engine's apply started.
  double prints_ms_ = 0;
  bool echoed_ = false;
  Clock::time_point apply_start_{};
  // Direct delivery offered in the Welcome: shared regions' keys, and per Hello tensor its
  // (region, offset); empty when not offered. direct_: the Begin chose it.
  std::vector<std::vector<std::uint8_t>> region_keys_;
  // Direct delivery: where each Hello tensor (or piece) goes, and the chunk index its chunk
  // hashes start from where the receiver takes them (Destination.chunkHashes).
  struct SharedDestination {
    std::uint32_t region = 0;
    std::uint64_t offset = 0;
    std::optional<std::uint64_t> chunk_base;
    std::uint64_t chunk_head = 0;  // bytes into the piece where chunk chunk_base begins
  };
  std::vector<SharedDestination> destinations_;
  bool direct_ = false;
  // Reads in place: the sender lends its tensors (Hello.lendsTensors), the Welcome offered to
  // read them, and this update does (Begin.readsTensors).
  bool lends_ = false;
  bool reads_offered_ = false;
  bool reads_ = false;
  bool takes_pieces_ = false;      // Welcome.takesPieces (offer_pieces)
  bool prints_at_commit_ = false;  // Begin.fingerprintsAtCommit
  bool slots_released_ = false;    // a kept direct session, or one that reads, let its slots go
  std::atomic<bool> apply_refused_{false};
  // A rank of a sharded update (Hello.shard): its update, rank, world and holdings.
  std::shared_ptr<ShardedUpdate> sharded_;
  std::uint32_t rank_ = 0;
  std::uint32_t world_ = 0;
  std::shared_ptr<const std::vector<Holding>> holdings_;  // read once, from the Hello
  DeclaredBlocks declared_;
  bool sends_needs_ = false;  // Hello.shard.sendsNeeds
  // What the rank sends of each holding (join_shard()); declared_ points into it.
  std::shared_ptr<const std::vector<Holding>> pieces_;
};

bool Session::next(std::uint32_t, update::Bucket& out) {
  const std::uint32_t k = next_;
  const std::uint32_t slots = data_->slot_count();
  if (!direct_ && !reads_ && k >= 1) {
    // The slot of a bucket applied already is free: post the receive that will use it.
    if (slots == 1) {
      if (k < bucket_count_) data_->post(0, k, deadline_in(settings_.bucket_timeout));
    } else if (k >= 2) {
      // Bucket k-2 (applied: the loop waited for it before it started bucket k-1).
      const std::uint32_t freed_slot = (last_slot_ + slots - 1) % slots;
      const std::uint32_t later = k - 2 + slots;
      if (later < bucket_count_)
        data_->post(freed_slot, later, deadline_in(settings_.bucket_timeout));
    }
  }
  const std::string phase = k < bucket_count_ ? fmt::format("bucket {}", k) : std::string("commit");
  auto msg = ch_.recv(
      deadline_in(k < bucket_count_ ? settings_.bucket_timeout : settings_.commit_timeout), phase);
  auto root = msg->root();
  switch (root.which()) {
    case Which::BUCKET: {
      auto b = root.getBucket();
      const std::uint32_t index = b.getIndex();
      const std::uint32_t slot = b.getSlot();
      const std::uint64_t bytes = b.getBytes();
      if (index != k || index >= bucket_count_) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: got bucket {} (of {})", ch_.peer(), phase, index,
             bucket_count_);
      }
      out.manifest_bytes.assign(b.getManifest().begin(), b.getManifest().end());
      out.index = index;
      if (reads_) {
        map_sources(b.getSources(), out, phase);
        ++next_;
        return true;
      }
      if (slot >= slots || bytes > capacity_) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: {}: slot {} / {} bytes is outside the {} slots of {} bytes", ch_.peer(), phase,
             slot, bytes, slots, capacity_);
      }
      if (double_buffered() && k >= 1 && slot == last_slot_) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: slot {} reused before bucket {} was acknowledged",
             ch_.peer(), phase, slot, k - 1);
      }
      data_->receive(ch_, slot, index, bytes, b.getDataFollows(),
                     deadline_in(settings_.bucket_timeout), phase);
      out.slot = slot;
      out.in_place = direct_;
      if (!direct_) {
        out.data = data_->slot(slot).first(bytes);
        out.kind = data_->slot_kind();
      }
      last_slot_ = slot;
      ++next_;
      return true;
    }
    case Which::COMMIT: {
      commit_start_ = Clock::now();
      if (k != bucket_count_) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit after {} of {} buckets", ch_.peer(), k,
             bucket_count_);
      }
      if (root.getCommit().getVersion() != version_) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit of version {} but version {} began", ch_.peer(),
             root.getCommit().getVersion(), version_);
      }
      const auto prints = root.getCommit().getFingerprints();
      const auto chunks = root.getCommit().getChunkHashes();
      commit_prints_.clear();
      commit_chunks_.clear();
      if (prints_at_commit_) {
        commit_prints_.reserve(prints.size());
        for (auto v : prints) commit_prints_.push_back(v);
        if (chunks.size() != 0 && chunks.size() != prints.size()) {
          fail(FERRY_STATUS_CORRUPT_DATA,
               "{}: commit: {} lists of chunk hashes for {} fingerprints", ch_.peer(),
               chunks.size(), prints.size());
        }
        commit_chunks_.reserve(chunks.size());
        for (auto list : chunks) {
          auto& hashes = commit_chunks_.emplace_back();
          hashes.reserve(list.size());
          for (auto v : list) hashes.push_back(v);
        }
      } else if (prints.size() != 0 || chunks.size() != 0) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit: fingerprints that the Begin did not announce",
             ch_.peer());
      }
      return false;
    }
    case Which::ABORT:
      fail(FERRY_STATUS_ABORTED, "{}: the sender aborted: {}", ch_.peer(),
           text(root.getAbort().getReason()));
    default:
      unexpected(ch_, phase, root.which());
  }
}

// On the applying thread: the manifest against what arrived, and the fingerprints the Ack
// carries, which the update engine then compares with the manifest's instead of hashing again.
void Session::verify(update::Bucket& bucket) {
  const std::string phase = fmt::format("bucket {}", bucket.index);
  if (!bucket.manifest) bucket.manifest = manifest::decode(bucket.manifest_bytes);
  const auto& decoded = *bucket.manifest;
  if (sharded_) {
    for (const auto& e : decoded.tensors) declared_.arrived(e);
  }
  const std::uint64_t bytes = direct_ || reads_ ? decoded.bucket_bytes : bucket.data.size();
  if (!direct_ && decoded.bucket_bytes != bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: the manifest says {} bytes but {} bytes arrived",
         ch_.peer(), phase, decoded.bucket_bytes, bytes);
  }
  if (decoded.bucket_index != bucket.index || decoded.bucket_count != bucket_count_) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "{}: {}: the manifest names bucket {} of {}, expected bucket {} of {}", ch_.peer(), phase,
         decoded.bucket_index, decoded.bucket_count, bucket.index, bucket_count_);
  }
  // Direct delivery: the sender's puts into the parameters completed before its BucketReady.
  // What they wrote is verified at commit, in one pass (or, with writer fingerprints trusted,
  // taken from the manifests); the Ack carries no fingerprints.
  if (direct_) return;
  const auto prints_start = Clock::now();
  echoed_ = false;
  if (reads_) {
    verify_read(bucket);
    apply_start_ = Clock::now();
    prints_ms_ = std::chrono::duration<double, std::milli>(apply_start_ - prints_start).count();
    return;
  }
  if (bucket.kind == FERRY_MEMORY_CUDA) {
    // A device bucket (cuda_ipc): the sender's flush finished before its BucketReady, so the
    // bytes are complete; the engine returns once the scatter out of the slot is done, so the
    // Ack frees the slot for the sender's next bucket. When the update engine verifies every
    // entry's fingerprint against the manifest before writing, the bytes as received have
    // exactly the manifest's fingerprints: the Ack repeats them (applied()) and the engine's
    // check is the one read of the bucket.
    bool echo = config_.update.verify_fingerprints;
    for (const auto& e : decoded.tensors) echo = echo && e.fingerprint.has_value();
    echoed_ = echo;
    if (!echo) bucket.entry_fingerprints = device_fingerprints(device_, bucket, decoded);
  } else {
    bucket.entry_fingerprints.reserve(decoded.tensors.size());
    for (const auto& e : decoded.tensors) {
      bucket.entry_fingerprints.push_back(kernels::fingerprint_cpu(
          bucket.data.data() + e.offset, e.size, config_.update.apply_threads));
    }
  }
  apply_start_ = Clock::now();
  prints_ms_ = std::chrono::duration<double, std::milli>(apply_start_ - prints_start).count();
}

// On the receiving thread, reads in place: the manifest decoded here (its entries' sizes are
// what the transport maps), and each entry's bytes mapped where the sender lent them. The
// mapping is the data path's: a kept session's next push finds the same tensors mapped.
void Session::map_sources(capnp::List<capnp::Data>::Reader sources, update::Bucket& out,
                          const std::string& phase) {
  out.manifest = manifest::decode(out.manifest_bytes);
  const auto& m = *out.manifest;
  if (sources.size() != m.tensors.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: {} sources for the {} entries of its manifest",
         ch_.peer(), phase, sources.size(), m.tensors.size());
  }
  const auto deadline = deadline_in(settings_.bucket_timeout);
  out.entry_data.clear();
  out.entry_data.reserve(m.tensors.size());
  for (unsigned i = 0; i < sources.size(); ++i) {
    const auto key = sources[i];
    if (key.size() == 0) {
      if (m.tensors[i].size != 0) {
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: tensor '{}' ({} bytes) came without its source",
             ch_.peer(), phase, m.tensors[i].name, m.tensors[i].size);
      }
      out.entry_data.push_back(nullptr);
      continue;
    }
    out.entry_data.push_back(data_->map_peer(std::span<const std::uint8_t>(key.begin(), key.size()),
                                             m.tensors[i].size, deadline));
  }
  out.kind = FERRY_MEMORY_CUDA;
  out.data = {};
  out.slot = 0;
  out.in_place = false;
  out.readable_until_commit = true;  // the sender lends its tensors until the Committed
}

void Session::verify_read(update::Bucket& bucket) {
  const auto& m = *bucket.manifest;
  for (const auto& e : m.tensors) {
    if (!e.fingerprint) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: bucket {}: tensor '{}' is to be read in place without the sender's fingerprint",
           ch_.peer(), bucket.index, e.name);
    }
  }
  echoed_ = config_.update.verify_fingerprints;
  if (echoed_) return;
  // The engine checks nothing here (update.verify_fingerprints off): the Ack carries the
  // fingerprints of what is there, which the sender compares with its own.
  bucket.entry_fingerprints = device_fingerprints(device_, bucket, m);
}

// On the applying thread: the bucket is applied (or recorded); the Ack lets the sender reuse its
// slot.
void Session::applied(const update::Bucket& bucket) {
  const std::string phase = fmt::format("bucket {}", bucket.index);
  std::vector<std::uint64_t> prints;
  if (!direct_) {
    if (echoed_) {
      for (const auto& e : bucket.manifest->tensors) prints.push_back(*e.fingerprint);
    } else {
      prints = bucket.entry_fingerprints;
    }
    logger("session")->debug(
        "{}: {}: {} tensors, {} bytes: ack fingerprints {:.3f} ms{}, apply_bucket {:.3f} ms",
        ch_.peer(), phase, bucket.manifest->tensors.size(), update::bucket_payload_bytes(bucket),
        prints_ms_, echoed_ ? " (echoed from the manifest)" : "",
        std::chrono::duration<double, std::milli>(Clock::now() - apply_start_).count());
  }
  send_ack(bucket.index, bucket.slot, prints, phase);
}
}  // namespace

void serve_session(Channel& channel, receiver::Receiver& receiver,
                   const registry::Registry& registry, const config::Config& config,
                   const ReceiverSessionSettings& settings, SessionLink& link) {
  {
    // The session (and its data path: registrations, exports, staging slots) is gone before
    // the link says so.
    Session session(channel, receiver, registry, config, settings, link);
    try {
      session.run();
    } catch (const Error& e) {
      session.fail_session(e.code(), e.what());
    } catch (const kj::Exception& e) {
      session.fail_session(FERRY_STATUS_CORRUPT_DATA,
                           fmt::format("{}: malformed session message ({})", channel.peer(),
                                       e.getDescription().cStr()));
    } catch (const std::exception& e) {
      session.fail_session(FERRY_STATUS_INTERNAL, fmt::format("{}: {}", channel.peer(), e.what()));
    }
  }
  link.set_ended();
}

}  // namespace ferry::session
