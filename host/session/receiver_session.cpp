// The receiver's side of one session (see session/receiver_session.hpp).
#include "session/receiver_session.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <kj/exception.h>

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
#include "store/store_device.hpp"

namespace ferry::session {
namespace {

using Which = wire::Message::Which;

const char* message_name(Which which) {
  switch (which) {
    case Which::HELLO: return "hello";
    case Which::WELCOME: return "welcome";
    case Which::REFUSAL: return "refusal";
    case Which::BEGIN: return "begin";
    case Which::READY: return "ready";
    case Which::BUCKET: return "bucket";
    case Which::ACK: return "ack";
    case Which::COMMIT: return "commit";
    case Which::COMMITTED: return "committed";
    case Which::ABORT: return "abort";
    case Which::CLOSING: return "closing";
  }
  return "unknown";
}

[[noreturn]] void unexpected(const Channel& ch, const std::string& phase, Which got) {
  fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected '{}' message", ch.peer(), phase,
       message_name(got));
}

// Fingerprints of the entries of a bucket in device memory of `device`, their kernels side by
// side (session/device_fingerprints.hpp). Entries were validated against the bucket's size by
// the manifest decoder.
std::vector<std::uint64_t> device_fingerprints(int device, std::span<const std::byte> bucket,
                                               const manifest::Manifest& m) {
  std::vector<const void*> data;
  std::vector<std::uint64_t> bytes;
  data.reserve(m.tensors.size());
  bytes.reserve(m.tensors.size());
  for (const auto& entry : m.tensors) {
    data.push_back(bucket.data() + entry.offset);
    bytes.push_back(entry.size);
  }
  return fingerprint_device_ranges(device, data, bytes,
                                   fmt::format("bucket {}", m.bucket_index));
}

// The bucket being applied on a worker thread while the next one arrives.
struct Inflight {
  std::uint32_t slot = 0;
  std::uint32_t index = 0;
  std::future<void> done;
};

class Session {
 public:
  Session(Channel& ch, receiver::Receiver& r, const registry::Registry& reg,
          const config::Config& cfg, const ReceiverSessionSettings& st, SessionLink& link)
      : ch_(ch), receiver_(r), registry_(reg), config_(cfg), settings_(st), link_(link) {}

  void run() {
    handshake();
    auto msg = ch_.recv(deadline_in(settings_.bucket_timeout), "begin");
    while (msg) {
      begin(msg->root());
      buckets_and_commit();
      if (!keep_) return;
      msg = next_update();
    }
  }

  // Ends a failed session: waits for the bucket being applied, aborts the update, tells the
  // sender why when the connection still works. Never throws.
  void fail_session(ferry_status_code_t code, const std::string& message) noexcept {
    std::string why = message;
    ferry_status_code_t why_code = code;
    try {
      if (inflight_) {
        try {
          inflight_->done.get();
        } catch (const Error& e) {
          // The apply failure is the cause; the socket error after it is a consequence.
          if (code == FERRY_STATUS_ABORTED || code == FERRY_STATUS_PEER_FAILED) {
            why = e.what();
            why_code = e.code();
          }
        } catch (const std::exception&) {
        }
        inflight_.reset();
      }
      if (data_) data_->abort(why);
      if (update_) update_->abort(why);
      update_.reset();
      logger("session")->warn("session with {} failed: {}", ch_.peer(), why);
      // Tried even after a connection error (a failed transport connect is PEER_FAILED too); a
      // dead socket fails at once, a stalled peer costs the 1 s send deadline at most.
      if (!apply_refused_ && !ch_.is_shut_down()) send_refusal(why_code, why);
    } catch (...) {
    }
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
        fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: tensor '{}' has {} dims (at most {})",
             ch_.peer(), phase, names[i], shape.size(), FERRY_MAX_DIMS);
      }
      d.ndim = shape.size();
      for (unsigned k = 0; k < shape.size(); ++k) d.shape[k] = shape[k];
      descs.push_back(d);
    }
    const auto open_start = Clock::now();
    config_json_ = text(hello.getConfigJson());
    try {
      update_ = receiver_.open_session(descs, config_json_);
    } catch (const Error& e) {
      fail(e.code(), "{}: layout check refused: {}", ch_.peer(), e.what());
    }
    epoch_ = update_->memory_epoch();
    keep_ = settings_.keep_sessions && hello.getKeepSession();

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
    const std::string wanted = text(hello.getTransport());
    if (wanted != "inline") {
      try {
        // Device transports get staging slots on the GPU the weights are on: an embedded
        // receiver's registered parameters decide, not the receiver.device default.
        device_ = receiver_.weights_cuda_device();
        data_ = make_plugin_receiver_path(registry_, config_, wanted, capacity_, slots, device_);
        data_->connect(
            std::span<const std::uint8_t>(hello.getTransportAddress().begin(),
                                          hello.getTransportAddress().size()),
            ch_.peer(), deadline_in(settings_.hello_timeout));
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
    offer_direct(text(hello.getDelivery()), descs);
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
    welcome.setLayoutSignature(update_->layout_signature());
    welcome.setNumParams(static_cast<std::uint32_t>(update_->num_params()));
    welcome.setTransport(data_->name());
    const auto address = data_->address();
    welcome.setTransportAddress(kj::arrayPtr(address.data(), address.size()));
    auto slot_list = welcome.initSlots(slots);
    for (std::uint32_t i = 0; i < slots; ++i) {
      slot_list[i].setCapacity(capacity_);
      const auto key = data_->slot_key(i);
      slot_list[i].setRemoteKey(kj::arrayPtr(key.data(), key.size()));
    }
    welcome.setBucketTimeoutMs(static_cast<std::uint64_t>(settings_.bucket_timeout.count()));
    welcome.setCommitTimeoutMs(static_cast<std::uint64_t>(settings_.commit_timeout.count()));
    welcome.setRmaNative(data_->rma_native());
    welcome.setKeepSession(keep_);
    welcome.setFingerprintsAtCommit(true);
    if (!destinations_.empty()) {
      auto regions = welcome.initRegions(static_cast<unsigned>(region_keys_.size()));
      for (unsigned i = 0; i < region_keys_.size(); ++i) {
        regions.set(i, kj::arrayPtr(region_keys_[i].data(), region_keys_[i].size()));
      }
      auto list = welcome.initDestinations(static_cast<unsigned>(destinations_.size()));
      for (unsigned i = 0; i < destinations_.size(); ++i) {
        list[i].setRegion(destinations_[i].first);
        list[i].setOffset(destinations_[i].second);
      }
    }
    ch_.send(m, deadline_in(settings_.hello_timeout), "handshake (welcome)");
    logger("session")->info(
        "session with {} ({}): layout accepted, {} parameters, data path {}{}", ch_.peer(),
        sender_, update_->num_params(), data_->name(),
        destinations_.empty() ? std::string()
                              : fmt::format(", direct delivery offered ({} shared regions)",
                                            region_keys_.size()));
  }

  // Direct delivery (DESIGN.md, "Two ways to deliver"): offered when the data path puts into
  // device memory and every tensor's plan is one whole copy into a device parameter; the memory
  // blocks holding those parameters are shared with the sender. Anything less: staged.
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
      try {
        std::map<const std::byte*, std::uint32_t> region_of;  // block base -> region index
        std::vector<std::pair<std::uint32_t, std::uint64_t>> destinations;
        std::vector<std::vector<std::uint8_t>> keys;
        for (const auto& d : dests) {
          auto [it, added] = region_of.emplace(d->block, static_cast<std::uint32_t>(keys.size()));
          if (added) keys.push_back(data_->share_region(d->block, d->block_bytes));
          destinations.emplace_back(it->second, static_cast<std::uint64_t>(d->data - d->block));
        }
        region_keys_ = std::move(keys);
        destinations_ = std::move(destinations);
        return;
      } catch (const Error& e) {
        why_not = e.what();
      }
    }
    logger("session")->info("session with {}: staged delivery ({})", ch_.peer(), why_not);
  }

  // A kept session between updates: the sender's next Begin, or nullptr when the session ends
  // (the sender closed it, it stayed idle past its limit, or the receiver is closing it).
  std::unique_ptr<Received> next_update() {
    std::unique_ptr<Received> msg;
    try {
      msg = ch_.recv(deadline_in(settings_.idle_timeout), "between updates");
    } catch (const Error& e) {
      if (e.code() == FERRY_STATUS_TIMEOUT) {
        logger("session")->info("kept session with {} ends: no update for {} s", ch_.peer(),
                                settings_.idle_timeout.count() / 1000);
      } else {
        logger("session")->debug("kept session with {} ends: {}", ch_.peer(), e.what());
      }
      return nullptr;
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

  // A later update of a kept session takes the update lock again and checks that the memory
  // shared in the handshake is still what the receiver's parameters live in.
  void reopen(const std::string& phase) {
    try {
      if (catalog_key_.empty()) catalog_key_ = manifest::catalog_key(descs_);
      update_ = receiver_.open_session(descs_, config_json_, &catalog_key_);
    } catch (const Error& e) {
      fail(e.code(), "{}: {}: {}", ch_.peer(), phase, e.what());
    }
    if (update_->memory_epoch() != epoch_) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "{}: {}: the receiver's memory was released or resumed since this session's "
           "handshake; the session ends (the sender opens a new one)",
           ch_.peer(), phase);
    }
  }

  void begin(wire::Message::Reader root) {
    const std::string phase = "begin";
    if (root.which() == Which::ABORT) {
      fail(FERRY_STATUS_ABORTED, "{}: the sender aborted before begin: {}", ch_.peer(),
           text(root.getAbort().getReason()));
    }
    if (root.which() != Which::BEGIN) unexpected(ch_, phase, root.which());
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
    if (slots_released_ && !direct_) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {}: staged delivery announced in a session that delivered directly (its staging "
           "slots are gone)",
           ch_.peer(), phase);
    }
    prints_at_commit_ = b.getFingerprintsAtCommit();
    if (prints_at_commit_ && !(direct_ && b.getWriterFingerprints())) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {}: fingerprints at commit announced without direct delivery by fingerprinting "
           "copies",
           ch_.peer(), phase);
    }
    const auto begin_start = Clock::now();
    update_->begin(version_, label.empty() ? std::nullopt : std::optional<std::string>(label));
    // Before the Ready: from then on the sender writes live parameters.
    if (direct_) update_->begin_direct_writes(b.getWriterFingerprints());
    logger("session")->debug("{}: begin of version {}: {:.3f} ms", ch_.peer(), version_,
                             std::chrono::duration<double, std::milli>(Clock::now() - begin_start)
                                 .count());
    for (std::uint32_t s = 0; s < data_->slot_count() && s < bucket_count_; ++s) {
      data_->post(s, s, deadline_in(settings_.bucket_timeout));
    }
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Message>().initReady().setVersion(version_);
    ch_.send(m, deadline_in(settings_.bucket_timeout), phase);
  }

  // Waits for the bucket being applied (rethrows its failure).
  void finish_inflight() {
    if (!inflight_) return;
    auto f = std::move(inflight_->done);
    inflight_.reset();
    f.get();
  }

  // Runs on a worker thread: validates the manifest against what arrived, applies, acks.
  void apply(std::uint32_t slot, std::uint32_t index, std::uint64_t bytes,
             std::vector<std::uint8_t> manifest_bytes) {
    try {
      const std::string phase = fmt::format("bucket {}", index);
      const auto decoded = manifest::decode(manifest_bytes);
      if (decoded.bucket_bytes != bytes) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: {}: the manifest says {} bytes but {} bytes arrived", ch_.peer(), phase,
             decoded.bucket_bytes, bytes);
      }
      if (decoded.bucket_index != index || decoded.bucket_count != bucket_count_) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "{}: {}: the manifest names bucket {} of {}, expected bucket {} of {}", ch_.peer(),
             phase, decoded.bucket_index, decoded.bucket_count, index, bucket_count_);
      }
      std::vector<std::uint64_t> prints;
      if (direct_) {
        // The sender's puts into the parameters completed before its BucketReady. What they
        // wrote is verified at commit, in one pass (or, with writer fingerprints trusted, taken
        // from the manifests); the Ack carries no fingerprints.
        update_->record_direct_bucket(decoded);
        send_ack(index, slot, prints, phase);
        return;
      }
      const auto data = data_->slot(slot).first(bytes);
      const ferry_memory_kind_t kind = data_->slot_kind();
      bool echo = false;
      const auto prints_start = Clock::now();
      if (kind == FERRY_MEMORY_CUDA) {
        // A device bucket (cuda_ipc): the sender's flush finished before its BucketReady, so
        // the bytes are complete; apply_bucket returns once the scatter out of the slot is
        // done, so the Ack below frees the slot for the sender's next bucket. When the update
        // engine verifies every entry's fingerprint against the manifest before writing, the
        // bytes as received have exactly the manifest's fingerprints: the Ack repeats them
        // instead of reading the bucket once more.
        echo = config_.update.verify_fingerprints;
        for (const auto& e : decoded.tensors) echo = echo && e.fingerprint.has_value();
        if (echo) {
          for (const auto& e : decoded.tensors) prints.push_back(*e.fingerprint);
        } else {
          prints = device_fingerprints(device_, data, decoded);
        }
      } else {
        prints.reserve(decoded.tensors.size());
        for (const auto& e : decoded.tensors) {
          prints.push_back(kernels::fingerprint_cpu(data.data() + e.offset, e.size,
                                                    config_.update.apply_threads));
        }
      }
      const auto apply_start = Clock::now();
      update_->apply_bucket(data, manifest_bytes, kind);
      logger("session")->debug(
          "{}: {}: {} tensors, {} bytes: ack fingerprints {:.3f} ms{}, apply_bucket {:.3f} ms",
          ch_.peer(), phase, decoded.tensors.size(), bytes,
          std::chrono::duration<double, std::milli>(apply_start - prints_start).count(),
          echo ? " (echoed from the manifest)" : "",
          std::chrono::duration<double, std::milli>(Clock::now() - apply_start).count());
      send_ack(index, slot, prints, phase);
    } catch (const Error& e) {
      // Tell the sender now (it may be waiting for this ack, not sending), then break the
      // session thread's wait; fail_session() reports this error.
      apply_refused_ = true;
      send_refusal(e.code(), e.what());
      ch_.shutdown();
      throw;
    } catch (const kj::Exception& e) {
      apply_refused_ = true;
      const std::string why = fmt::format("{}: bucket {}: bad manifest ({})", ch_.peer(), index,
                                          e.getDescription().cStr());
      send_refusal(FERRY_STATUS_CORRUPT_DATA, why);
      ch_.shutdown();
      throw Error(FERRY_STATUS_CORRUPT_DATA, why);
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

  void buckets_and_commit() {
    std::uint32_t next = 0;
    while (true) {
      const std::string phase =
          next < bucket_count_ ? fmt::format("bucket {}", next) : std::string("commit");
      auto msg = ch_.recv(deadline_in(next < bucket_count_ ? settings_.bucket_timeout
                                                           : settings_.commit_timeout),
                          phase);
      auto root = msg->root();
      switch (root.which()) {
        case Which::BUCKET: {
          auto b = root.getBucket();
          const std::uint32_t index = b.getIndex();
          const std::uint32_t slot = b.getSlot();
          const std::uint64_t bytes = b.getBytes();
          if (index != next || index >= bucket_count_) {
            fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: got bucket {} (of {})", ch_.peer(), phase,
                 index, bucket_count_);
          }
          if (slot >= data_->slot_count() || bytes > capacity_) {
            fail(FERRY_STATUS_CORRUPT_DATA,
                 "{}: {}: slot {} / {} bytes is outside the {} slots of {} bytes", ch_.peer(),
                 phase, slot, bytes, data_->slot_count(), capacity_);
          }
          if (inflight_ && inflight_->slot == slot) {
            fail(FERRY_STATUS_CORRUPT_DATA,
                 "{}: {}: slot {} reused before bucket {} was acknowledged", ch_.peer(), phase,
                 slot, inflight_->index);
          }
          std::vector<std::uint8_t> manifest(b.getManifest().begin(), b.getManifest().end());
          data_->receive(ch_, slot, index, bytes, b.getDataFollows(),
                         deadline_in(settings_.bucket_timeout), phase);
          finish_inflight();
          if (direct_) {
            // A bucket written in place needs only its bookkeeping (no data to apply): recorded
            // and acked here, without a worker thread per bucket.
            apply(slot, index, bytes, std::move(manifest));
            ++next;
            break;
          }
          // The slot of the bucket just finished is free: post the receive that will use it.
          if (index >= 1) {
            const std::uint32_t freed_slot = (slot + data_->slot_count() - 1) % data_->slot_count();
            const std::uint32_t later = index - 1 + static_cast<std::uint32_t>(data_->slot_count());
            if (later < bucket_count_ && data_->slot_count() > 1) {
              data_->post(freed_slot, later, deadline_in(settings_.bucket_timeout));
            }
          }
          Inflight f;
          f.slot = slot;
          f.index = index;
          f.done = std::async(std::launch::async, [this, slot, index, bytes,
                                                   m = std::move(manifest)]() mutable {
            apply(slot, index, bytes, std::move(m));
          });
          inflight_ = std::move(f);
          if (data_->slot_count() == 1 && index + 1 < bucket_count_) {
            finish_inflight();
            data_->post(0, index + 1, deadline_in(settings_.bucket_timeout));
          }
          ++next;
          break;
        }
        case Which::COMMIT: {
          finish_inflight();
          if (next != bucket_count_) {
            fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit after {} of {} buckets", ch_.peer(), next,
                 bucket_count_);
          }
          if (root.getCommit().getVersion() != version_) {
            fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit of version {} but version {} began",
                 ch_.peer(), root.getCommit().getVersion(), version_);
          }
          const auto commit_start = Clock::now();
          const auto prints = root.getCommit().getFingerprints();
          if (prints_at_commit_) {
            std::vector<std::uint64_t> values;
            values.reserve(prints.size());
            for (auto v : prints) values.push_back(v);
            update_->attach_direct_fingerprints(values);
          } else if (prints.size() != 0) {
            fail(FERRY_STATUS_CORRUPT_DATA, "{}: commit: fingerprints that the Begin did not announce",
                 ch_.peer());
          }
          const auto report = update_->commit();
          logger("session")->debug(
              "{}: commit of version {}: {:.3f} ms (coverage, fingerprints of every parameter "
              "and of what was written in place, publish)",
              ch_.peer(), version_,
              std::chrono::duration<double, std::milli>(Clock::now() - commit_start).count());
          capnp::MallocMessageBuilder m;
          auto c = m.initRoot<wire::Message>().initCommitted();
          c.setVersion(report.version.number);
          c.setLabel(report.version.label);
          c.setSeconds(report.seconds);
          ch_.send(m, deadline_in(settings_.commit_timeout), "commit (committed)");
          // Idle from here (a kept session), then the update lock goes: a release of the
          // receiver's memory, which takes that lock, finds this session idle and closes it.
          // Not before the Committed is out: a Closing must never overtake it.
          if (keep_) link_.set_idle();
          update_.reset();
          // Direct delivery is the session's for good (the handshake decided): a kept session
          // needs no staging slots, and their memory is the engine's again.
          if (keep_ && direct_) {
            data_->release_slots();
            slots_released_ = true;
          }
          return;
        }
        case Which::ABORT:
          fail(FERRY_STATUS_ABORTED, "{}: the sender aborted: {}", ch_.peer(),
               text(root.getAbort().getReason()));
        default:
          unexpected(ch_, phase, root.which());
      }
    }
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
  std::uint64_t epoch_ = 0;  // the receiver's memory epoch at the handshake
  std::unique_ptr<receiver::Receiver::StreamingUpdate> update_;
  std::unique_ptr<ReceiverDataPath> data_;
  int device_ = -1;  // the GPU of the data path's device slots; -1: host slots
  std::uint64_t capacity_ = 0;
  std::uint64_t version_ = 0;
  std::uint32_t bucket_count_ = 0;
  std::optional<Inflight> inflight_;
  // Direct delivery offered in the Welcome: shared regions' keys, and per Hello tensor its
  // (region, offset); empty when not offered. direct_: the Begin chose it.
  std::vector<std::vector<std::uint8_t>> region_keys_;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> destinations_;
  bool direct_ = false;
  bool prints_at_commit_ = false;  // Begin.fingerprintsAtCommit
  bool slots_released_ = false;    // a kept direct session let its staging slots go
  std::atomic<bool> apply_refused_{false};
};

}  // namespace

void SessionLink::set_idle() {
  std::lock_guard lock(mutex_);
  idle_ = true;
}

bool SessionLink::leave_idle() {
  std::lock_guard lock(mutex_);
  idle_ = false;
  return !closing_;
}

void SessionLink::set_ended() {
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
    idle_ = false;
  }
  changed_.notify_all();
}

bool SessionLink::start_closing() {
  std::lock_guard lock(mutex_);
  if (!idle_ || closing_ || ended_) return false;
  closing_ = true;
  return true;
}

bool SessionLink::wait_ended(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return ended_; });
}

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
      session.fail_session(FERRY_STATUS_INTERNAL,
                           fmt::format("{}: {}", channel.peer(), e.what()));
    }
  }
  link.set_ended();
}

}  // namespace ferry::session
