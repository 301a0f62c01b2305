// ucx/ucx_transport.hpp: one UCX transport instance (a ucp_context + ucp_worker with its progress
// thread), its peers (endpoints), registrations and requests: the objects behind the opaque
// handles of the ferry transport ABI.
//
// Threading (README.md, "Threading"): every UCX call is made with `mutex` held, and the worker
// runs in UCS_THREAD_MODE_SERIALIZED. A thread in request_wait polls the worker itself (progress
// on wait: no hand-off latency); while nobody waits, a progress thread owned by the instance polls
// it whenever anything is outstanding (and parks on `changed` when nothing is), so transfers
// advance and peer failures are detected while the host is busy elsewhere (double buffering).
// UCX callbacks run with the mutex held, in whichever thread drove UCX; they only update request
// state and notify.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shared_segment.hpp"
#include "split_copy.hpp"
#include "ucx_wire.hpp"

namespace ferry::ucx {

// How put() is treated on a peer (option `rma`).
enum class RmaPolicy {
  automatic,  // put only over RDMA or mapped shared memory (not tcp, not cma); else refused
  always,     // put everywhere (over tcp UCX emulates it, ~1% of tagged throughput)
  never,      // put always refused: buckets go by tagged rendezvous only
};

// How endpoints handle a peer's failure (option `error_mode`).
enum class ErrorMode : std::uint32_t {
  none = 0,       // UCP_ERR_HANDLING_MODE_NONE + the plugin's liveness check (same host only)
  peer = 1,       // UCP_ERR_HANDLING_MODE_PEER: UCX fails requests to a dead peer
  automatic = 2,  // per endpoint: none for a peer on this host (UCX's zero-copy protocols, which
                  // peer mode gives up over tcp and shared memory), peer for any other. Not the
                  // default: over tcp UCX logs "error during flush" whenever a NONE endpoint is
                  // closed after its peer's worker (a normal end of a session)
};

// The endpoint mode `mode` gives for a peer on this host (`same_host`) or not: true = peer.
bool peer_errors_for(ErrorMode mode, bool same_host);

struct Options {
  std::optional<std::string> tls;       // UCX_TLS for this instance
  ErrorMode error_mode = ErrorMode::peer;  // error_mode = peer (default) | auto | none
  RmaPolicy rma = RmaPolicy::automatic;
  std::string keepalive_interval = "1s";  // UCX_KEEPALIVE_INTERVAL: how soon a dead peer shows
  std::uint32_t spin_polls = 4096;        // idle polls before the progress thread naps
};

// Whether a `tls` option (unset: UCX's own choice, all transports) lets this instance use shared
// memory: a copy into a same-host peer's mapped segment is a shared-memory transport too.
bool tls_allows_shared_memory(const std::optional<std::string>& tls);

// Parses [transport.ucx] options; throws INVALID_ARGUMENT naming an unknown key or a bad value.
Options parse_options(const ferry_option_t* options, std::size_t count);

// Which memory kinds this UCX build can register (HOST|PINNED, plus CUDA when UCX was built with
// CUDA support). Probed once per process with a throwaway context.
std::uint32_t supported_memory_kinds();

}  // namespace ferry::ucx

struct ferry_peer;
struct ferry_memory;
struct ferry_request;

struct ferry_transport {
  ferry_transport(const ferry_transport_create_args_t& args, ferry::ucx::Options options);
  ~ferry_transport();
  ferry_transport(const ferry_transport&) = delete;
  ferry_transport& operator=(const ferry_transport&) = delete;

  std::vector<std::uint8_t> address() const;
  ferry_peer* connect(const ferry_connect_args_t& args);
  void disconnect(ferry_peer* peer);
  ferry_memory* register_memory(const ferry_memory_desc_t& desc);
  ferry::sdk::Allocation alloc_memory(const ferry_memory_desc_t& desc);
  std::vector<std::uint8_t> pack_key(ferry_memory* memory);
  void deregister_memory(ferry_memory* memory);
  ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
  ferry_request* put(ferry_peer* peer, const ferry_put_args_t& args);
  ferry_request* flush(ferry_peer* peer, std::int64_t deadline_ns);
  // Returns true when done; throws the request's error when it failed.
  bool request_test(ferry_request* request);
  void request_wait(ferry_request* request, std::int64_t deadline_ns);
  void request_free(ferry_request* request) noexcept;
  void abort(const char* reason) noexcept;  // NULL: "no reason given"

  // --- used by the UCX callbacks (mutex held) ---
  void complete_locked(ferry_request* request, ucs_status_t status, std::size_t length);
  void peer_failed_locked(ferry_peer* peer, const std::string& why);

  ferry_role_t role;
  ferry::ucx::Options options;
  std::uint32_t memory_kinds = 0;

  std::mutex mutex;  // guards UCX and every field below
  std::condition_variable changed;  // a request finished, a peer failed, abort, more work
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<std::uint8_t> worker_address;  // ucp_worker_get_address bytes
  std::uint32_t own_stream = 0;              // stream_id(worker_address)
  std::set<ferry_peer*> peers;
  std::set<ferry_memory*> memories;
  std::set<ferry_request*> requests;  // every request not yet freed by both the caller and UCX
  std::size_t outstanding = 0;        // UCX operations in flight (the progress thread spins)
  bool aborted = false;
  std::string abort_reason;
  bool stopping = false;
  bool peers_to_reap = false;  // a peer failed; the progress thread closes it and fails its recvs
  bool wake_pending = false;   // a waiter was notified: the progress thread yields the mutex once
  std::vector<void*> closing;  // ucp_ep_close_nbx requests still running
  std::atomic<int> api_waiting{0};  // API calls waiting for the mutex (the progress thread yields)
  std::size_t waiters = 0;          // threads in request_wait, polling the worker themselves
  std::int64_t next_liveness_ns = 0;  // next /proc check of the peers
  bool liveness_checked = false;      // a peer's endpoint has no UCX error handling (NONE)
  std::thread progress_thread;
  ferry::ucx::SplitCopy split_copy;  // puts that are copies into the peer's mapped memory
  bool copy_into_segments = false;   // tls allows shared memory: puts into a same-host peer's
                                     // alloc_memory segment are copies (see put)
  std::string own_process_space;     // "<boot_id>/<pid namespace>" of this process

 private:
  void progress_loop();
  unsigned progress_once_locked();
  void yield_if_wanted(std::unique_lock<std::mutex>& lock);
  void nap_if_idle(std::unique_lock<std::mutex>& lock, std::uint32_t idle);
  std::unique_lock<std::mutex> api_lock();
  void reap_failed_peers_locked();
  void reap_closing_locked();
  ferry_peer* checked_peer_locked(ferry_peer* peer, const char* call) const;
  ucp_request_param_t request_param(ferry_request* request);
  bool settled_locked(ferry_request* request);
  void check_liveness_locked();
  void fail_request_locked(ferry_request* request, ferry_status_code_t code, std::string message);
  void cancel_ucx_locked(ferry_request* request);
  void close_endpoint_locked(ferry_peer* peer, bool force);
  void throw_if_aborted_locked() const;
  ferry_request* start_locked(ferry_peer* peer, std::string what, std::int64_t deadline_ns,
                              std::uint64_t expected_length);
  void finish_start_locked(ferry_request* request, ucs_status_ptr_t status);
  // ucp_mem_map of [base, +size); throws naming `call` (OUT_OF_MEMORY or IO).
  ucp_mem_h map_locked(void* base, std::uint64_t size, ucs_memory_type_t type, const char* call);
  ucp_rkey_h rkey_for_locked(ferry_peer* peer, const ferry::ucx::KeyInfo& key);
  std::uint8_t* segment_for_locked(ferry_peer* peer, const ferry::ucx::KeyInfo& key,
                                   const ferry_memory* local);
  void* local_pointer(const ferry_memory_range_t& range, const char* what) const;
};

// A connected peer: one endpoint, created with peer error handling unless error_mode = none.
struct ferry_peer {
  ferry_transport* owner = nullptr;
  std::string name;
  ucp_ep_h ep = nullptr;
  std::uint32_t sender_stream = 0;  // upper tag bits of buckets flowing sender -> receiver
  bool rma_native = false;          // an rma_bw lane over RDMA or mapped shared memory
  std::string lanes;                // transports of the endpoint's lanes, for the log
  bool failed = false;
  std::string failure;              // why (names the peer)
  bool same_host = false;           // same kernel and PID namespace (the liveness check works)
  bool peer_errors = true;          // this endpoint's UCP_ERR_HANDLING_MODE_PEER (else NONE)
  std::uint32_t pid = 0;            // for the liveness check of a NONE endpoint
  bool copied_since_flush = false;  // a put was copied into its mapped memory (see put)
  std::map<std::uint64_t, ucp_rkey_h> rkeys;  // by key blob checksum
  // The peer's alloc_memory segments mapped here, by key blob checksum, kept until the endpoint
  // closes (mapped, they stay valid whatever the peer does); keys whose segment cannot be mapped
  // here (permissions, limits) go by UCX.
  std::map<std::uint64_t, ferry::ucx::MappedSegment> segments;
  std::set<std::uint64_t> unmappable;
};

struct ferry_memory {
  void* base = nullptr;
  std::uint64_t size = 0;
  ferry_memory_kind_t kind = FERRY_MEMORY_HOST;
  ucp_mem_h memh = nullptr;
  // alloc_memory's shared segment (freed after ucp_mem_unmap); null for register_memory.
  std::unique_ptr<ferry::ucx::OwnedSegment> segment;
};

struct ferry_request {
  ferry_transport* owner = nullptr;
  ferry_peer* peer = nullptr;  // nullptr after the peer was disconnected
  std::string what;            // "bucket 3 from sender X", for messages
  std::int64_t deadline_ns = 0;
  std::uint64_t expected_length = 0;  // recv: the posted capacity (more is CORRUPT_DATA)
  bool is_recv = false;
  void* ucx = nullptr;          // the UCX request while UCX holds it (counted in outstanding)
  bool ucx_completed = false;   // UCX reported completion (possibly inside the starting call)
  bool done = false;            // as the caller sees it
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
  bool caller_freed = false;
};
