// cuda_ipc/cuda_ipc_transport.hpp: one instance of the CUDA IPC transport: registrations (VMM
// chunks exported as POSIX fds, or legacy cudaIpc handles), the per-peer cache of imported and
// mapped peer memory, and the copies (put, staged bucket pulls) on the instance's stream.
//
// Memory: an import reserves the address range of a peer registration once per (peer,
// registration) and maps each of its chunks when a copy first reaches it; disconnect/destroy
// unmap them. A chunk's fd is closed once it is mapped (the mapping holds the memory), and
// closed unmapped at disconnect. A registration of the owner retains its VMM allocation handles
// until deregister, so the physical memory a peer mapped stays valid meanwhile: deregister (and
// re-register, re-pack keys) around a release/resume of the store's tag.
//
// Ordering (README.md): flush = an event recorded on the instance's stream after every put so
// far, waited for on the host; the host then tells the peer by its own control message. A staged
// pull (recv_bucket) waits for the sender's BucketReady, copies, waits for the copy and only
// then sends BucketReleased, which completes the sender's send_bucket request.
//
// Threading: as the ABI says per function; internal state is guarded so that request_wait /
// request_test / abort may run on other threads than the session thread.
#pragma once

#include <ferry/plugin.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda_driver.hpp"
#include "ipc_link.hpp"

namespace ferry::cuda_ipc {

struct Options {
  std::string socket_dir;  // where the instance's Unix socket lives ($TMPDIR or /tmp)
  // Streams the fingerprinting copies of consecutive flushes alternate between (1 or 2): two
  // let one flush's launch run beside the previous one's (see ferry_transport::lanes_).
  unsigned copy_lanes = 2;
};
Options parse_options(const ferry_option_t* options, std::size_t count);

// An opened legacy cudaIpc allocation, shared by every import that lies in it.
struct LegacyOpening {
  void* base = nullptr;
  int device = 0;
  ~LegacyOpening();
};

// Peer memory mapped into this process. VMM: the address range is reserved at import and each
// of the peer's chunks is mapped when a copy first touches it (ferry_transport::mapped), so
// mapping the rest of a large region overlaps the first copies; its fd stays open until then.
struct Imported {
  std::uint8_t* base = nullptr;  // the registered base in this address space
  std::uint64_t size = 0;
  CUdeviceptr va = 0;  // VMM: the reservation (0 for legacy)
  std::uint64_t span = 0;
  struct Chunk {
    std::uint64_t offset = 0;  // from va
    std::uint64_t size = 0;
    ferry::cuda_ipc::UniqueFd fd;  // until mapped
    bool mapped = false;
  };
  std::vector<Chunk> chunks;  // VMM, in address order
  bool all_mapped = false;  // every chunk is mapped (they stay so while imported); the peer's mutex
  std::shared_ptr<LegacyOpening> legacy;
};

}  // namespace ferry::cuda_ipc

struct ferry_memory {
  struct Chunk {
    CUmemGenericAllocationHandle handle = 0;  // retained; released on deregister
    std::uint64_t offset = 0;                 // from the span start
    std::uint64_t size = 0;
  };
  std::uint64_t id = 0;
  std::uint8_t* base = nullptr;
  std::uint64_t size = 0;
  ferry_memory_kind_t kind = FERRY_MEMORY_CUDA;
  ferry::cuda_ipc::ShareKind share = ferry::cuda_ipc::ShareKind::Vmm;
  std::string not_shareable;  // non-empty: why pack_key refuses (still usable as a local range)
  // False until resolve_share() found the fields below (CUDA memory, on first need).
  bool resolved = true;
  // Its id went to a peer (pack_key, send_bucket), which may import it: deregister_memory then
  // tells every peer (Revoked). The local side of puts (a sender's tensors, thousands a push,
  // registered and deregistered every push) never goes, and tells no one.
  std::atomic<bool> offered{false};
  std::vector<Chunk> chunks;      // VMM
  std::uint64_t base_offset = 0;  // VMM: base - span start; legacy: base - allocation base
  cudaIpcMemHandle_t ipc{};       // legacy
  // VMM: every chunk exported as an fd ahead of the first import (pack_key starts it on a thread
  // of its own; an export costs ~85 us per chunk), taken by the first import answer. Guarded by
  // memory_mutex_; deregister waits for it.
  std::future<std::vector<ferry::cuda_ipc::UniqueFd>> early_export;
};

struct ferry_peer {
  std::unique_ptr<ferry::cuda_ipc::PeerLink> link;
  std::mutex mutex;                                            // guards imports
  std::map<std::uint64_t, ferry::cuda_ipc::Imported> imports;  // by the peer's memory id
};

struct ferry_request {
  enum class Kind { Flush, Send, Recv };  // (a put has none: it is deferred to its flush)
  Kind kind = Kind::Flush;
  ferry_peer* peer = nullptr;   // NULL once the peer was disconnected
  cudaEvent_t event = nullptr;  // Flush: recorded after every put it covers
  std::uint64_t covers = 0;     // Flush: issued_ticket_ when its event was recorded
  std::uint32_t bucket_index = 0;
  std::uint8_t* dst = nullptr;  // Recv: where the bucket goes
  std::uint64_t capacity = 0;
  int stage = 0;  // Recv: 0 waits for BucketReady, 1 copying
  bool done = false;
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
};

struct ferry_transport {
  ferry_transport(const ferry_transport_create_args_t& args, ferry::cuda_ipc::Options options);
  ~ferry_transport();
  ferry_transport(const ferry_transport&) = delete;
  ferry_transport& operator=(const ferry_transport&) = delete;

  std::vector<std::uint8_t> address() const;
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer) noexcept;

  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  std::vector<std::uint8_t> pack_key(ferry_memory* memory);
  void deregister_memory(ferry_memory* memory) noexcept;

  ferry_request* put(ferry_peer* peer, const ferry_put_args_t& args);
  void put_many(ferry_peer* peer, std::span<const ferry_put_args_t> puts);
  // Imports and maps the peer's memories these keys name, ahead of the puts (plugin ABI 1.9).
  void prepare_puts(ferry_peer* peer, std::span<const ferry_blob_t> keys, std::int64_t deadline_ns);
  // The peer's registered memory imported and mapped here, for reading in place (ABI 1.10).
  const void* map_peer_memory(ferry_peer* peer, const ferry_blob_t& key, std::uint64_t offset,
                              std::uint64_t size, std::int64_t deadline_ns);
  // The flush's event is recorded now; its deadline is the one request_wait is given.
  ferry_request* flush(ferry_peer* peer, std::int64_t deadline_ns);
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);

  // Advances `request`; waits at most until deadline_ns (<= now: does not block). Returns true
  // when done; throws the request's error once it failed.
  bool progress(ferry_request* request, std::int64_t deadline_ns);
  // progress without waiting.
  bool request_test(ferry_request* request) { return progress(request, 0); }
  // progress until deadline_ns (0 or less: 300 s from now); TIMEOUT naming the peer after it.
  void request_wait(ferry_request* request, std::int64_t deadline_ns);
  void request_free(ferry_request* request) noexcept;
  void abort(const char* reason) noexcept;

  // Imports on this instance, over every peer (tests).
  std::size_t import_count();

 private:
  // The device and stream, created on first use (so a GPU-less create still works).
  void ensure_cuda();
  // An event from the pool (timing: one that records time, for the launch log).
  cudaEvent_t take_event(bool timing = false);
  void return_event(cudaEvent_t event) noexcept;
  ferry_request* new_request(ferry_request::Kind kind, ferry_peer* peer);
  ferry::cuda_ipc::Imported& import(ferry_peer* peer, std::uint64_t memory_id,
                                    std::optional<ferry::cuda_ipc::ShareKind> expected,
                                    std::int64_t deadline_ns);
  // A put's key decoded and checked: this peer's, not revoked.
  ferry::cuda_ipc::Key checked_key(ferry_peer* peer, const ferry_blob_t& blob, const char* call);
  // Unmaps the imports of registrations `peer` revoked since the last call (peer.mutex held).
  void drop_revoked_imports(ferry_peer& peer);
  // The import of `key`'s memory, whose size must still be the key's.
  ferry::cuda_ipc::Imported& import_of(ferry_peer* peer, const ferry::cuda_ipc::Key& key,
                                       std::int64_t deadline_ns, const char* call);
  ferry::cuda_ipc::Imported reserve_vmm(ferry::cuda_ipc::PayloadReader& body,
                                        std::vector<ferry::cuda_ipc::UniqueFd>& fds,
                                        const std::string& peer);
  void unmap(ferry::cuda_ipc::Imported& imported) noexcept;
  // The address of bytes [offset, offset + bytes) of an import (offset from its registered
  // base, in range), mapping the chunks they lie in where not mapped yet.
  std::uint8_t* mapped(ferry_peer* peer, ferry::cuda_ipc::Imported& imported, std::uint64_t offset,
                       std::uint64_t bytes);
  void map_chunk_locked(ferry::cuda_ipc::Imported& imported,
                        ferry::cuda_ipc::Imported::Chunk& chunk);  // peer->mutex held
  ferry::cuda_ipc::Endpoint::ImportAnswer answer_import(std::uint64_t memory_id);
  // Exports every chunk of a resolved VMM registration as a POSIX fd, in order.
  std::vector<ferry::cuda_ipc::UniqueFd> export_chunks(const ferry_memory& memory);
  std::uint8_t* local_range(const ferry_memory_range_t& range, const char* what);
  // Finds how CUDA memory is shared (VMM chunks retained, or the legacy allocation's handle);
  // once per registration. Throws for memory the driver does not know (not device memory, or
  // past the end of its allocation).
  void resolve_share(ferry_memory& memory);
  // Throws ABORTED after abort().
  void check_not_aborted();
  // Enqueues the queued copies on the stream, as one batch (cuda_mutex_ held).
  void issue_pending_locked();
  // Hands the fingerprints of every batch issued up to `covers` (whose copies and read-back the
  // stream has passed) to their puts' fingerprint_out (cuda_mutex_ held).
  void deliver_prints_locked(std::uint64_t covers) noexcept;

  ferry_role_t role_;
  int device_;
  ferry::cuda_ipc::Nonce nonce_;
  std::unique_ptr<ferry::cuda_ipc::Endpoint> endpoint_;

  std::mutex cuda_mutex_;  // stream creation, enqueues, event pool
  bool cuda_ready_ = false;
  cudaStream_t stream_ = nullptr;
  // The fingerprinting copy kernel hashes each 1 MiB chunk with one warp, so a launch of a
  // few thousand chunks keeps only that many warps busy. Consecutive flushes' launches go
  // to alternate lanes and may run side by side: the GPU then has twice the chunks in flight.
  // stream_ waits for every lane launch right after it (so a flush's event on stream_ covers
  // every put before it), and a launch waits for stream_ first when its destinations overlap
  // the previous launch's or stream_ has copies of its own since (puts stay ordered).
  unsigned copy_lanes_ = 2;
  cudaStream_t lanes_[2] = {nullptr, nullptr};
  cudaEvent_t lane_done_[2] = {nullptr, nullptr};
  cudaEvent_t stream_tail_ = nullptr;
  unsigned next_lane_ = 0;
  bool stream_own_work_ = false;  // copies on stream_ since a lane last waited for it
  // The destinations [lo, hi) of the last lane launch, sorted and merged: a launch runs beside
  // it unless one of its own destinations overlaps one of these (a bounding box would order
  // every launch into an engine's parameters, which a caching allocator interleaves).
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> last_ranges_;
  std::vector<cudaEvent_t> free_events_;
  std::uint64_t granularity_ = 0;
  // Puts are queued and enqueued together (one batched copy kernel, batch_copy.hpp) by the
  // next flush or wait: a copy call per put costs more CPU time than a small tensor's copy takes.
  struct PendingCopy {
    ferry_peer* peer = nullptr;
    std::uint8_t* dst = nullptr;
    const std::uint8_t* src = nullptr;
    std::uint64_t bytes = 0;
    bool device_source = false;  // the local side is CUDA memory (else host: a copy call)
    std::uint64_t* fingerprint_out = nullptr;   // ferry_put_args_t.fingerprint_out
    std::uint64_t* chunk_hashes_out = nullptr;  // ferry_put_args_t.chunk_hashes_out (ABI 1.7)
    std::uint64_t chunk_index_base = 0;
  };
  std::vector<PendingCopy> pending_;
  // Puts that asked for their fingerprint go through the fused copy kernel
  // (launch_fingerprinted_copy), which leaves the values in device memory; they are read back
  // into page-locked memory on the stream and handed out by the request that sees the stream
  // pass them (deliver_prints_locked).
  struct PrintBatch {
    std::uint64_t issued = 0;       // issued_ticket_ after the issue that launched it
    std::uint64_t* host = nullptr;  // page-locked, at least outs.size() entries
    std::size_t capacity = 0;
    std::vector<std::uint64_t*> outs;
    // Puts that asked for their chunk hashes: where they go, and where the op's hashes start
    // in the launch's read-back (host + chunk_hashes_at) and how many.
    struct ChunkOut {
      std::uint64_t* out;
      std::uint64_t first;
      std::uint64_t count;
    };
    std::vector<ChunkOut> chunk_outs;
    std::uint64_t* chunk_hashes = nullptr;  // within host: every chunk hash of the launch
    // Timing events around the launch on its lane, for the debug log (where GPU time goes).
    cudaEvent_t began = nullptr;
    cudaEvent_t ended = nullptr;
    std::uint64_t bytes = 0;
    unsigned lane = 0;
    // Host time of its issue (the debug log): all of it, taking the page-locked array, the
    // stream-ordered allocation of the fingerprints, the launch.
    double issue_ms = 0, pinned_ms = 0, malloc_ms = 0, launch_ms = 0;
  };
  std::deque<PrintBatch> print_batches_;  // oldest first; arrays from a process-wide pool
  std::vector<cudaEvent_t> free_timing_events_;
  cudaEvent_t previous_began_ = nullptr;  // the last delivered batch's (kept for the next one)
  void log_launch_locked(PrintBatch& batch) noexcept;
  std::uint64_t next_ticket_ = 0;    // tickets handed to puts so far
  std::uint64_t issued_ticket_ = 0;  // every put up to this ticket is enqueued on the stream

  std::mutex memory_mutex_;  // registrations (the service thread reads them)
  std::mutex share_mutex_;   // resolve_share; taken after memory_mutex_, never before
  std::map<std::uint64_t, ferry_memory*> memory_;
  std::uint64_t next_memory_id_ = 1;

  std::mutex legacy_mutex_;
  // By (peer nonce, the allocation's address in the peer): one opening per peer allocation.
  std::map<std::string, std::weak_ptr<ferry::cuda_ipc::LegacyOpening>> legacy_;

  std::mutex state_mutex_;  // peers, requests, abort reason
  std::set<ferry_peer*> peers_;
  std::set<ferry_request*> requests_;
  std::string aborted_;
};
