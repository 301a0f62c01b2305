// session/data_path.hpp: how bucket bytes move between a sender and one receiver during a session.
// Two kinds: "inline" (the bytes follow their BucketReady on the session socket itself; always
// available, the fallback) and a transport plugin (e.g. "ucx": put+flush into the receiver's
// registered staging slots where RMA is native, or a send into a receive the receiver posted where
// it is emulated). The session code (sender/, receiver_session.cpp) drives both the same way:
// (A plugin that reads and writes CUDA memory, e.g. "cuda_ipc", gets device staging slots on the
// receiver's GPU, and the sender puts each CUDA tensor straight from its own memory into the
// receiver's slot instead of packing it first: deliver_pieces().)
//
//   receiver: slots registered -> Welcome carries address + slot keys -> connect(sender address)
//             -> per bucket: post(slot) [emulated RMA] ... receive(slot) -> apply -> Ack
//   sender:   connect(receiver address, keys) -> per bucket: pack into slot -> deliver(slot)
//             -> BucketReady -> after_header(slot) [inline: the data frame]
//
// Threading: one session thread drives each object; abort() may be called from any thread.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "session/channel.hpp"

namespace ferry::config {
struct Config;
}
namespace ferry::registry {
class Registry;
}

namespace ferry::session {

// Staging memory aligned to FERRY_BUCKET_ALIGNMENT (what manifests and kernels expect).
class SlotBuffer {
 public:
  explicit SlotBuffer(std::uint64_t capacity);
  std::span<std::byte> bytes() const noexcept { return bytes_; }

 private:
  std::unique_ptr<std::byte[]> storage_;
  std::span<std::byte> bytes_;
};

class ReceiverDataPath {
 public:
  virtual ~ReceiverDataPath() = default;
  virtual std::string name() const = 0;
  virtual std::size_t slot_count() const = 0;
  // The slot's bytes: host memory, or device memory of the receiver's GPU when slot_kind() is
  // FERRY_MEMORY_CUDA (never dereference those on the host).
  virtual std::span<std::byte> slot(std::uint32_t index) = 0;
  virtual ferry_memory_kind_t slot_kind() const { return FERRY_MEMORY_HOST; }
  // The rendezvous blob of this side (empty for inline) and the packed remote key of a slot.
  virtual std::vector<std::uint8_t> address() { return {}; }
  virtual std::vector<std::uint8_t> slot_key(std::uint32_t) { return {}; }
  // Direct delivery: registers `bytes` bytes of device memory at `base` (on the receiver's GPU;
  // e.g. a weight-store region) with the transport for the path's lifetime and returns its packed
  // key, which the sender puts into. UNIMPLEMENTED where the path cannot.
  virtual std::vector<std::uint8_t> share_region(void* /*base*/, std::uint64_t /*bytes*/) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "data path '{}' cannot share device memory", name());
  }
  // True when slot keys are given (the sender may write slots by put+flush).
  virtual bool rma_native() const { return false; }
  // From the Begin: true when buckets arrive by put+flush before their BucketReady; false when
  // by a send into a receive this side posts (post()).
  virtual void set_via_put(bool /*via_put*/) {}
  virtual void connect(std::span<const std::uint8_t> /*sender_address*/,
                       const std::string& /*peer*/, Clock::time_point /*deadline*/) {}
  // Emulated RMA: posts the receive of bucket `bucket_index` into `slot` (the slot is free).
  virtual void post(std::uint32_t /*slot*/, std::uint32_t /*bucket_index*/,
                    Clock::time_point /*deadline*/) {}
  // Makes the `bytes` bytes of bucket `bucket_index` present in `slot` (inline: reads the data
  // frame that follows the header from `channel`; plugins: waits for the posted receive).
  virtual void receive(Channel& channel, std::uint32_t slot, std::uint32_t bucket_index,
                       std::uint64_t bytes, bool data_follows, Clock::time_point deadline,
                       const std::string& phase) = 0;
  // Direct delivery was chosen for a kept session: no bucket will ever be in a slot, so their
  // memory goes (an idle session then holds none of the GPU's memory). slot() must not be
  // called afterwards; slot_count() is unchanged (slot numbers still label buckets).
  virtual void release_slots() noexcept {}
  // Reads in place (docs/architecture.md, "Three ways to deliver"): true when the transport maps
  // memory the sender lent (SenderDataPath::lend) into this process for the update engine's
  // kernels (plugin ABI 1.10 map_peer_memory; device memory of the receiver's GPU).
  virtual bool reads_peer_memory() const { return false; }
  // Where this process reads the `bytes` bytes the sender lent under `key` (the sender's memory,
  // mapped here by the transport until the path goes). UNIMPLEMENTED where the path cannot.
  virtual const std::byte* map_peer(std::span<const std::uint8_t> /*key*/, std::uint64_t /*bytes*/,
                                    Clock::time_point /*deadline*/) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "data path '{}' cannot read the sender's memory", name());
  }
  virtual void abort(const std::string& /*reason*/) noexcept {}
};

// One tensor of a bucket for deliver_pieces(): `size` bytes at `data` (host or CUDA memory of
// `device`) go to byte `offset` of the bucket, or (direct delivery, `region` >= 0) to byte
// `offset` of the receiver's shared region `region` (set_regions()). With `fingerprint` set
// (only where fingerprints_pieces()), the path stores there the fingerprint of the bytes it
// wrote, computed as it wrote them, by the time the piece's bucket is finished (not for an
// empty piece, which writes nothing). With `chunk_hashes` also set (only where
// hashes_piece_chunks()), it stores there the hash of each 1 MiB chunk it wrote, numbered from
// `chunk_base` (ferry_put_args_t.chunk_hashes_out), and `fingerprint` is their XXH64.
struct TensorPiece {
  const void* data = nullptr;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;
  ferry_memory_kind_t kind = FERRY_MEMORY_HOST;
  int device = 0;
  std::int64_t region = -1;
  std::uint64_t* fingerprint = nullptr;
  std::uint64_t* chunk_hashes = nullptr;
  std::uint64_t chunk_base = 0;
};

// How many start_pieces() calls may be started and not finished (SenderDataPath): three, so
// that the sender queues the next group of copies while two run (a transport may run
// consecutive flushes side by side, as cuda_ipc's copy lanes do).
inline constexpr std::size_t kMaxStartedPieces = 3;

class SenderDataPath {
 public:
  virtual ~SenderDataPath() = default;
  virtual std::string name() const = 0;
  virtual std::size_t slot_count() const = 0;
  // Local memory the sender packs bucket `slot` into (registered with the transport).
  virtual std::span<std::byte> slot(std::uint32_t index) = 0;
  virtual std::vector<std::uint8_t> address() { return {}; }
  // After the Welcome: the receiver's address and slot keys (empty when it offers no RMA).
  // Decides whether buckets go by put+flush (uses_put()) or by send.
  virtual void connect(std::span<const std::uint8_t> /*receiver_address*/,
                       const std::vector<std::vector<std::uint8_t>>& /*slot_keys*/,
                       bool /*rma_native*/, const std::string& /*peer*/,
                       Clock::time_point /*deadline*/) {}
  virtual bool uses_put() const { return false; }
  // True when deliver_pieces() may be used for a bucket whose tensors are all in memory of
  // `kind` (decided after connect): the path then writes each tensor from its own memory into
  // the receiver's slot, and the sender packs nothing into slot().
  virtual bool delivers_pieces(ferry_memory_kind_t /*kind*/) const { return false; }
  // True when pieces in CUDA memory may ask for the fingerprint of what is written
  // (TensorPiece::fingerprint): the transport's copy computes it in the same pass
  // (FERRY_TRANSPORT_CAP_PUT_FINGERPRINT). Known from creation on.
  virtual bool fingerprints_pieces() const { return false; }
  // True when such pieces may also ask for their chunk hashes (TensorPiece::chunk_hashes,
  // FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES). Known from creation on.
  virtual bool hashes_piece_chunks() const { return false; }
  // Direct delivery: the packed keys of the receiver's shared regions (Welcome), in order.
  virtual void set_regions(std::vector<std::vector<std::uint8_t>> /*keys*/) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "data path '{}' cannot write into shared regions", name());
  }
  // Direct delivery: gets the shared regions ready for the puts to come (the transport imports
  // and maps them, plugin ABI 1.9 prepare_puts), where the transport can; otherwise the first
  // puts into each region do that. Writes nothing. Returns the regions it prepared.
  virtual std::size_t prepare_regions(Clock::time_point /*deadline*/) { return 0; }
  // Writes every piece into the receiver's slot `slot` at its offset; complete and visible to
  // the receiver when it returns (before the BucketReady is sent). The pieces' memory must hold
  // its final bytes (device work on it finished). Alignment padding is left as it was.
  virtual void deliver_pieces(std::uint32_t /*slot*/, std::uint32_t /*bucket_index*/,
                              std::span<const TensorPiece> /*pieces*/,
                              Clock::time_point /*deadline*/, const std::string& /*phase*/) {}
  // The same in two halves, so that the next bucket's copies can be queued before this one is
  // announced: start_pieces() queues the writes (at most kMaxStartedPieces calls started and
  // not finished), finish_pieces() returns once the oldest started bucket's writes are complete and
  // visible to the receiver. By default start does all the work.
  // With `launch` false (only where defers_pieces()), the writes are queued and nothing is
  // written until launch_pieces(): the sender queues the first copies while the receiver is
  // still beginning the update. Should it refuse, the path is dropped with what it queued.
  virtual void start_pieces(std::uint32_t slot, std::uint32_t bucket_index,
                            std::vector<TensorPiece> pieces, Clock::time_point deadline,
                            const std::string& phase, bool launch = true) {
    (void)launch;
    deliver_pieces(slot, bucket_index, pieces, deadline, phase);
  }
  virtual bool defers_pieces() const { return false; }
  // Starts the writes of the oldest start_pieces(..., launch = false) not yet started.
  virtual void launch_pieces(Clock::time_point /*deadline*/, const std::string& /*phase*/) {}
  virtual void finish_pieces(Clock::time_point /*deadline*/, const std::string& /*phase*/) {}
  // Moves `bytes` bytes of local slot `slot` into the receiver's slot `slot` (complete and
  // visible when it returns), before the BucketReady is sent. Inline: nothing.
  virtual void deliver(std::uint32_t /*slot*/, std::uint32_t /*bucket_index*/,
                       std::uint64_t /*bytes*/, Clock::time_point /*deadline*/,
                       const std::string& /*phase*/) {}
  // True when the bytes follow the BucketReady on the session socket.
  virtual bool data_follows() const { return false; }
  virtual void after_header(Channel& /*channel*/, std::uint32_t /*slot*/, std::uint64_t /*bytes*/,
                            Clock::time_point /*deadline*/, const std::string& /*phase*/) {}
  // Reads in place: true when the receiver may map this side's CUDA tensors (lend()) and run
  // its plan from them (the same transport's ReceiverDataPath::reads_peer_memory). Known from
  // creation on.
  virtual bool lends_tensors() const { return false; }
  // The packed key of `bytes` bytes of CUDA memory at `data` (a tensor on this side's GPU) for
  // the receiver to read in place. Its registration outlives the push: the pushes of a kept
  // session lend the same tensors, and the receiver's mapping of them stays. end_push() lets go
  // of those the push did not lend. UNIMPLEMENTED where the path cannot.
  virtual std::vector<std::uint8_t> lend(const void* /*data*/, std::uint64_t /*bytes*/) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "data path '{}' cannot lend tensors", name());
  }
  // Before a push lends anything: lets go of lent memory that lies in another allocation than
  // when it was lent (the trainer freed its tensors and made new ones at the same addresses), so
  // that lend() registers it again and the receiver maps the new memory, not the old.
  virtual void check_lent() {}
  // A push ended and the path is kept for the next one (a kept session): it lets go of
  // everything of that push's tensors (their registrations), which need not outlive it, but
  // those it lent (lend()), which stay until a push no longer lends them.
  virtual void end_push() noexcept {}
  virtual void abort(const std::string& /*reason*/) noexcept {}
};

std::unique_ptr<ReceiverDataPath> make_inline_receiver_path(std::uint64_t capacity,
                                                            std::size_t slots);
std::unique_ptr<SenderDataPath> make_inline_sender_path(std::uint64_t capacity, std::size_t slots);

// Transport plugins (data_path_plugin.cpp). `name` is the plugin's name ("ucx"). Throw
// ferry::Error when the plugin cannot be loaded or set up (the caller may fall back to inline).
// `device`: the CUDA ordinal this side works on, or -1. For a device transport (declares
// FERRY_TRANSPORT_CAP_SAME_NODE_ONLY and FERRY_MEMORY_CUDA: cuda_ipc) the receiver's slots are
// device memory of `device` (a receiver with device -1 is refused, INCOMPATIBLE) and the
// sender's plugin instance works on `device` (its tensors' GPU); other plugins ignore it.
std::unique_ptr<ReceiverDataPath> make_plugin_receiver_path(const registry::Registry& registry,
                                                            const config::Config& config,
                                                            const std::string& name,
                                                            std::uint64_t capacity,
                                                            std::size_t slots, int device = -1);
std::unique_ptr<SenderDataPath> make_plugin_sender_path(const registry::Registry& registry,
                                                        const config::Config& config,
                                                        const std::string& name,
                                                        std::uint64_t capacity, std::size_t slots,
                                                        int device = -1);

}  // namespace ferry::session
