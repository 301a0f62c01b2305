// ferry/sdk/transport_plugin.hpp: the C boundary of a transport plugin written once: the
// ferry_transport_api_t table, get_caps and the negotiation, built over a C++ transport class
// whose methods come in declared groups, so that a transport's entry file says only what it is
// (model_plugin.hpp is the model plugins' counterpart). A vendor's transport starts here.
//
// A plugin describes itself with a struct and exports the entry through it:
//
//   struct LoopPlugin {
//     using Transport = ferry_transport;  // the class behind ferry_transport_t (any class)
//     static constexpr const char* kName = "loop";     // must match the file name
//     static constexpr const char* kVersion = "1.0";
//     // the option keys create accepts ([transport.loop]), NULL-terminated; sdk::kNoOptions for
//     // none; nullptr: not declared (then only create checks them)
//     static constexpr const char* const* kOptions = ferry::sdk::kNoOptions;
//     static constexpr std::uint32_t kGroups =
//         ferry::sdk::kPointToPoint | ferry::sdk::kMemory | ferry::sdk::kDirectWrite;
//     // optional: SAME_NODE_ONLY, SEPARATE_PROCESSES (where the peers may be), GROUP_RENDEZVOUS
//     // (how a broadcast group meets); default none
//     static constexpr std::uint32_t kConstraints = 0;
//     static ferry::sdk::TransportCaps caps();           // memory kinds, bucket size, in flight
//     static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args);
//   };
//   extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
//       ferry_plugin_negotiation_t* negotiation) {
//     return ferry::sdk::TransportPlugin<LoopPlugin>::negotiate(negotiation);
//   }
//
// The groups (kGroups) and the methods each one needs on Transport. A group is all or none: a
// declared group missing a method, and a method of a group not declared, fail to compile; the
// table entries of an undeclared group are NULL; and every capability bit (get_caps' flags) comes
// from the group that serves it, so a table never claims a capability whose functions are
// missing. The handles are the ABI's own structs, defined by the plugin where it uses them.
//
//   kPointToPoint (CAP_POINT_TO_POINT), kBroadcast (CAP_BROADCAST): the same methods
//     std::vector<std::uint8_t> address();                       // get_address
//     ferry_peer* connect(const ferry_connect_args_t& args);
//     void disconnect(ferry_peer* peer) noexcept;
//     ferry_request* send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
//     ferry_request* recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket);
//   kMemory (no bit)
//     ferry_memory* register_memory(const ferry_memory_desc_t& desc);
//     void deregister_memory(ferry_memory* memory) noexcept;
//   kAllocMemory (no bit, ABI 1.7; needs kMemory): memory the transport allocates and registers,
//   freed by deregister_memory
//     sdk::Allocation alloc_memory(const ferry_memory_desc_t& desc);  // desc.base is NULL
//   kDirectWrite (CAP_DIRECT_WRITE; needs kMemory and a peer group)
//     std::vector<std::uint8_t> pack_key(ferry_memory* memory);
//     ferry_request* put(ferry_peer* peer, const ferry_put_args_t& args);
//     ferry_request* flush(ferry_peer* peer, std::int64_t deadline_ns);
//   kPutFingerprint (CAP_PUT_FINGERPRINT; needs kDirectWrite): no method, put honours
//     args.fingerprint_out
//   kPutChunkHashes (CAP_PUT_CHUNK_HASHES, ABI 1.8; needs kPutFingerprint): no method, put
//     honours args.chunk_hashes_out and args.chunk_index_base
//   kDeferredPuts (CAP_PUT_DEFERRED; needs kDirectWrite)
//     void put_many(ferry_peer* peer, std::span<const ferry_put_args_t> puts);
//   kPreparePuts (no bit, ABI 1.9; needs kDirectWrite): the peer's memory later puts will write
//     void prepare_puts(ferry_peer* peer, std::span<const ferry_blob_t> keys,
//                       std::int64_t deadline_ns);
//   kMapPeerMemory (no bit, ABI 1.10; needs kDirectWrite): the peer's registered memory, mapped
//     here for reading in place
//     const void* map_peer_memory(ferry_peer* peer, const ferry_blob_t& key, std::uint64_t offset,
//                                 std::uint64_t size, std::int64_t deadline_ns);
//   kAsync (CAP_ASYNC; needs a peer group)
//     bool request_test(ferry_request* request);                 // true: done
//     void request_wait(ferry_request* request, std::int64_t deadline_ns);
//     void request_free(ferry_request* request) noexcept;
//   kSource (CAP_SOURCE): on Transport, then on Source (Family::Source, default the plugin's
//   struct ferry_source)
//     std::unique_ptr<Source> source_open(const char* uri);
//     std::vector<std::uint8_t> Source::catalog();              // source_catalog
//     sdk::SourceBucket Source::read(const ferry_source_read_args_t& args);  // source_read
//     (source_close deletes the source: its destructor closes it)
//   kAbort (no bit)
//     void abort(const char* reason) noexcept;                   // reason may be NULL
//   always: get_caps (kFlags from the groups and kConstraints, the rest from caps()), create
//     (Family::create) and destroy (deletes the Transport).
//
// What the table does for every method, once: a NULL transport, out, request, peer, memory,
// source or uri, and a NULL or too short struct argument (create args: to num_options; memory
// desc: to kind; connect, bucket and put args: to deadline_ns; source read args: to
// bytes_written), are INVALID_ARGUMENT ("<kName> <call>: ..."); every `out` is cleared before
// the call (source_read: manifest and bytes_written; dst NULL with a capacity is refused);
// struct arguments are copied into zeroed full-size structs (fields past the caller's struct_size
// read as zero; create args without `device` read as device -1; struct_size keeps the caller's
// value, so a method that needs a later field can check it); returned byte vectors become
// blobs that own them; every exception becomes a ferry_error_t as sdk::guard says (ferry::Error
// keeps its code and message). The void functions (destroy, disconnect, deregister_memory,
// request_free, abort, source_close) ignore NULL handles and swallow exceptions. Threading is
// plugin.h's per function; the table adds no lock. Header-only: it links nothing new.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry::sdk {

// Function groups of a transport (Family::kGroups, see the top of this file).
inline constexpr std::uint32_t kPointToPoint = 1u << 0;
inline constexpr std::uint32_t kBroadcast = 1u << 1;
inline constexpr std::uint32_t kMemory = 1u << 2;
inline constexpr std::uint32_t kDirectWrite = 1u << 3;
inline constexpr std::uint32_t kPutFingerprint = 1u << 4;
inline constexpr std::uint32_t kDeferredPuts = 1u << 5;
inline constexpr std::uint32_t kAsync = 1u << 6;
inline constexpr std::uint32_t kSource = 1u << 7;
inline constexpr std::uint32_t kAbort = 1u << 8;
inline constexpr std::uint32_t kAllocMemory = 1u << 9;
inline constexpr std::uint32_t kPutChunkHashes = 1u << 10;
inline constexpr std::uint32_t kPreparePuts = 1u << 11;
inline constexpr std::uint32_t kMapPeerMemory = 1u << 12;
inline constexpr std::uint32_t kAllTransportGroups = (1u << 13) - 1;

// The capability bits that say where the peers may be rather than which functions exist
// (Family::kConstraints); every other bit comes from the groups.
inline constexpr std::uint32_t kConstraintFlags = FERRY_TRANSPORT_CAP_SAME_NODE_ONLY |
                                                  FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES |
                                                  FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS;

// The get_caps flags of a transport declaring `groups` and `constraints`.
constexpr std::uint32_t transport_flags(std::uint32_t groups, std::uint32_t constraints) noexcept {
  std::uint32_t flags = constraints & kConstraintFlags;
  if (groups & kPointToPoint) flags |= FERRY_TRANSPORT_CAP_POINT_TO_POINT;
  if (groups & kBroadcast) flags |= FERRY_TRANSPORT_CAP_BROADCAST;
  if (groups & kDirectWrite) flags |= FERRY_TRANSPORT_CAP_DIRECT_WRITE;
  if (groups & kPutFingerprint) flags |= FERRY_TRANSPORT_CAP_PUT_FINGERPRINT;
  if (groups & kPutChunkHashes) flags |= FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES;
  if (groups & kDeferredPuts) flags |= FERRY_TRANSPORT_CAP_PUT_DEFERRED;
  if (groups & kAsync) flags |= FERRY_TRANSPORT_CAP_ASYNC;
  if (groups & kSource) flags |= FERRY_TRANSPORT_CAP_SOURCE;
  return flags;
}

// The fields of ferry_transport_caps_t other than the flags (Family::caps()).
struct TransportCaps {
  std::uint32_t memory_kinds = 0;            // ferry_memory_kind_t bits
  std::uint64_t preferred_bucket_bytes = 0;  // 0: no preference
  std::uint32_t max_inflight_buckets = 0;    // 0 means 1
};

// Memory a transport allocated and registered (kAllocMemory): its first byte and registration.
struct Allocation {
  void* data = nullptr;
  ferry_memory* memory = nullptr;
};

// One bucket a source read: its manifest (tensor_meta.capnp bytes) and the bytes of dst it
// covers.
struct SourceBucket {
  std::vector<std::uint8_t> manifest;
  std::uint64_t bytes_written = 0;
};

// Hands `bytes` over as a blob whose release frees them.
inline ferry_blob_t owned_blob(std::vector<std::uint8_t> bytes) {
  auto* owned = new std::vector<std::uint8_t>(std::move(bytes));
  ferry_blob_t blob{};
  blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  blob.data = owned->data();
  blob.size = owned->size();
  blob.release = [](const std::uint8_t*, void* ctx) {
    delete static_cast<std::vector<std::uint8_t>*>(ctx);
  };
  blob.release_ctx = owned;
  return blob;
}

namespace transport_detail {
// Family::kConstraints, 0 where the family declares none.
template <typename Family>
constexpr std::uint32_t constraints() noexcept {
  if constexpr (requires { Family::kConstraints; }) {
    return Family::kConstraints;
  } else {
    return 0;
  }
}
// Family::Source, the plugin's struct ferry_source where the family names none.
template <typename Family>
struct source {
  using type = ferry_source;
};
// clang-format off
template <typename Family>
  requires requires { typename Family::Source; }
struct source<Family> {

  using type = typename Family::Source;
};
}  // namespace transport_detail

// The transport table over Family (see the top of this file). ferry_transport_t is the
// Family::Transport pointer itself and ferry_source_t the Family::Source (default: the plugin's
// struct ferry_source) pointer, opaque to the host.
template <typename Family>
class TransportPlugin {
 public:
  using Transport = typename Family::Transport;
  using Source = typename transport_detail::source<Family>::type;
  static constexpr std::uint32_t kGroups = Family::kGroups;
  static constexpr std::uint32_t kConstraints = transport_detail::constraints<Family>();
  static constexpr std::uint32_t kFlags = transport_flags(kGroups, kConstraints);

  static const ferry_transport_api_t* api() noexcept { return &kApi; }

  // The whole body of the plugin's ferry_plugin_negotiate.
  static ferry_error_t* negotiate(ferry_plugin_negotiation_t* negotiation) noexcept {
    return sdk::negotiate(negotiation, FERRY_PLUGIN_TRANSPORT, Family::kName, Family::kVersion,
                          &kApi, Family::kOptions);
  }

 private:
  static constexpr bool kPeers = (kGroups & (kPointToPoint | kBroadcast)) != 0;
  static constexpr bool kHasMemory = (kGroups & kMemory) != 0;
  static constexpr bool kHasDirectWrite = (kGroups & kDirectWrite) != 0;
  static constexpr bool kHasDeferredPuts = (kGroups & kDeferredPuts) != 0;
  static constexpr bool kHasAsync = (kGroups & kAsync) != 0;
  static constexpr bool kHasSource = (kGroups & kSource) != 0;
  static constexpr bool kHasAbort = (kGroups & kAbort) != 0;
  static constexpr bool kHasAlloc = (kGroups & kAllocMemory) != 0;
  static constexpr bool kHasPrepare = (kGroups & kPreparePuts) != 0;
  static constexpr bool kHasMapPeer = (kGroups & kMapPeerMemory) != 0;

  // The declaration is consistent: groups known, their prerequisites declared, flags only of
  // the constraint kind.
  static_assert((kGroups & ~kAllTransportGroups) == 0, "kGroups holds an unknown group");
  static_assert((kConstraints & ~kConstraintFlags) == 0,
                "kConstraints may hold only SAME_NODE_ONLY, SEPARATE_PROCESSES and "
                "GROUP_RENDEZVOUS: every other capability bit comes from kGroups");
  static_assert(kPeers || kHasSource,
                "kGroups declares no topology (kPointToPoint, kBroadcast or kSource)");
  static_assert(!kHasDirectWrite || (kHasMemory && kPeers),
                "kDirectWrite needs kMemory and kPointToPoint or kBroadcast");
  static_assert((kGroups & kPutFingerprint) == 0 || kHasDirectWrite,
                "kPutFingerprint needs kDirectWrite");
  static_assert((kGroups & kPutChunkHashes) == 0 || (kGroups & kPutFingerprint) != 0,
                "kPutChunkHashes needs kPutFingerprint");
  static_assert(!kHasDeferredPuts || kHasDirectWrite, "kDeferredPuts needs kDirectWrite");
  static_assert(!kHasAsync || kPeers, "kAsync needs kPointToPoint or kBroadcast");
  static_assert(!kHasAlloc || kHasMemory, "kAllocMemory needs kMemory");
  static_assert(!kHasPrepare || kHasDirectWrite, "kPreparePuts needs kDirectWrite");
  static_assert(!kHasMapPeer || kHasDirectWrite, "kMapPeerMemory needs kDirectWrite");

  // All or none: each group's methods exist exactly when the group is declared.
  // clang-format off
  static_assert(kPeers == requires(Transport& t) {
                  { t.address() } -> std::convertible_to<std::vector<std::uint8_t>>; },
                "std::vector<std::uint8_t> address(): with kPointToPoint or kBroadcast, and "
                "only then");
  static_assert(kPeers == requires(Transport& t, const ferry_connect_args_t& a) {
                  { t.connect(a) } -> std::same_as<ferry_peer*>; },
                "ferry_peer* connect(const ferry_connect_args_t&): with kPointToPoint or "
                "kBroadcast, and only then");
  static_assert(kPeers == requires(Transport& t, ferry_peer* p) { t.disconnect(p); },
                "disconnect(ferry_peer*): with kPointToPoint or kBroadcast, and only then");
  static_assert(kPeers == requires(Transport& t, ferry_peer* p, const ferry_bucket_io_t& b) {
                  { t.send_bucket(p, b) } -> std::same_as<ferry_request*>;
                  { t.recv_bucket(p, b) } -> std::same_as<ferry_request*>; },
                "ferry_request* send_bucket / recv_bucket(ferry_peer*, const ferry_bucket_io_t&): "
                "with kPointToPoint or kBroadcast, and only then");
  static_assert(kHasMemory == requires(Transport& t, const ferry_memory_desc_t& d) {
                  { t.register_memory(d) } -> std::same_as<ferry_memory*>; },
                "ferry_memory* register_memory(const ferry_memory_desc_t&): with kMemory, and "
                "only then");
  static_assert(kHasMemory == requires(Transport& t, ferry_memory* m) { t.deregister_memory(m); },
                "deregister_memory(ferry_memory*): with kMemory, and only then");
  static_assert(kHasDirectWrite == requires(Transport& t, ferry_memory* m) {
                  { t.pack_key(m) } -> std::convertible_to<std::vector<std::uint8_t>>; },
                "std::vector<std::uint8_t> pack_key(ferry_memory*): with kDirectWrite, and only "
                "then");
  static_assert(kHasDirectWrite == requires(Transport& t, ferry_peer* p, const ferry_put_args_t& a) {
                  { t.put(p, a) } -> std::same_as<ferry_request*>; },
                "ferry_request* put(ferry_peer*, const ferry_put_args_t&): with kDirectWrite, "
                "and only then");
  static_assert(kHasDirectWrite == requires(Transport& t, ferry_peer* p, std::int64_t d) {
                  { t.flush(p, d) } -> std::same_as<ferry_request*>; },
                "ferry_request* flush(ferry_peer*, std::int64_t): with kDirectWrite, and only "
                "then");
  static_assert(kHasDeferredPuts == requires(Transport& t, ferry_peer* p,
                                             std::span<const ferry_put_args_t> puts) {
                  t.put_many(p, puts); },
                "put_many(ferry_peer*, std::span<const ferry_put_args_t>): with kDeferredPuts, "
                "and only then");
  static_assert(kHasAsync == requires(Transport& t, ferry_request* r, std::int64_t d) {
                  { t.request_test(r) } -> std::convertible_to<bool>;
                  t.request_wait(r, d);
                  t.request_free(r); },
                "bool request_test(ferry_request*), request_wait(ferry_request*, std::int64_t) "
                "and request_free(ferry_request*): with kAsync, and only then");
  static_assert(kHasSource == requires(Transport& t, const char* uri) {
                  { t.source_open(uri) } -> std::same_as<std::unique_ptr<Source>>; },
                "std::unique_ptr<Source> source_open(const char*): with kSource, and only then");
  static_assert(kHasAbort == requires(Transport& t, const char* reason) { t.abort(reason); },
                "abort(const char*): with kAbort, and only then");
  static_assert(kHasAlloc == requires(Transport& t, const ferry_memory_desc_t& d) {
                  { t.alloc_memory(d) } -> std::same_as<Allocation>; },
                "sdk::Allocation alloc_memory(const ferry_memory_desc_t&): with kAllocMemory, "
                "and only then");
  static_assert(kHasPrepare == requires(Transport& t, ferry_peer* p,
                                        std::span<const ferry_blob_t> keys, std::int64_t d) {
                  t.prepare_puts(p, keys, d); },
                "prepare_puts(ferry_peer*, std::span<const ferry_blob_t>, std::int64_t): with "
                "kPreparePuts, and only then");
  static_assert(kHasMapPeer == requires(Transport& t, ferry_peer* p, const ferry_blob_t& key,
                                        std::uint64_t n, std::int64_t d) {
                  { t.map_peer_memory(p, key, n, n, d) } -> std::same_as<const void*>; },
                "const void* map_peer_memory(ferry_peer*, const ferry_blob_t&, std::uint64_t, "
                "std::uint64_t, std::int64_t): with kMapPeerMemory, and only then");
  // clang-format on

  static Transport& self(ferry_transport_t* transport) {
    return *reinterpret_cast<Transport*>(transport);
  }

  // The checks every entry makes, each failing with INVALID_ARGUMENT "<kName> <call>: ...".
  static void require(bool ok, const char* call, const char* what) {
    if (!ok) fail(FERRY_STATUS_INVALID_ARGUMENT, "{} {}: {} is NULL", Family::kName, call, what);
  }
  static Transport& transport_of(ferry_transport_t* transport, const char* call) {
    require(transport != nullptr, call, "transport");
    return self(transport);
  }
  template <typename T>
  static void clear_out(T* out, const char* call) {
    require(out != nullptr, call, "out");
    *out = T{};
  }
  // A caller's struct copied into a zeroed full-size one (fields past its struct_size stay 0).
  template <typename T>
  static T read_struct(const T* p, std::size_t min_size, const char* call, const char* what) {
    if (p == nullptr || p->struct_size < min_size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{} {}: {} is NULL or its struct_size is too small",
           Family::kName, call, what);
    }
    T copy{};
    std::memcpy(&copy, p, std::min(p->struct_size, sizeof copy));
    return copy;
  }
  // The shape of most entries: the transport, `out` cleared, then *out = body(transport).
  template <typename Out, typename Body>
  static ferry_error_t* into(ferry_transport_t* transport, Out* out, const char* call,
                             Body&& body) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, call);
      clear_out(out, call);
      *out = body(t);
    });
  }
  static ferry_put_args_t read_put(const ferry_put_args_t* args, const char* call) {
    return read_struct(args, FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns), call, "put args");
  }
  // Runs a void entry's body: nothing escapes it.
  template <typename Body>
  static void quietly(Body&& body) noexcept {
    try {
      body();
    } catch (...) {
      // The ABI gives these functions no way to fail.
    }
  }

  // --- core ------------------------------------------------------------------------------------

  static ferry_error_t* get_caps(ferry_transport_caps_t* caps) noexcept {
    return guard([&] {
      if (caps == nullptr || caps->struct_size < sizeof(size_t)) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} get_caps: caps is NULL or has no struct_size",
             Family::kName);
      }
      const TransportCaps declared = Family::caps();
      ferry_transport_caps_t full{};
      full.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
      full.flags = kFlags;
      full.memory_kinds = declared.memory_kinds;
      full.preferred_bucket_bytes = declared.preferred_bucket_bytes;
      full.max_inflight_buckets = declared.max_inflight_buckets;
      // Fill only what both sides know; struct_size then says which fields are present.
      const size_t size = std::min(caps->struct_size, full.struct_size);
      std::memcpy(reinterpret_cast<char*>(caps) + sizeof(size_t),
                  reinterpret_cast<const char*>(&full) + sizeof(size_t), size - sizeof(size_t));
      caps->struct_size = size;
    });
  }

  static ferry_error_t* create(const ferry_transport_create_args_t* args,
                               ferry_transport_t** out) noexcept {
    return guard([&] {
      clear_out(out, "create");
      auto a = read_struct(args, FERRY_STRUCT_SIZE(ferry_transport_create_args_t, num_options),
                           "create", "create args");
      if (a.struct_size < FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device)) a.device = -1;
      if (a.num_options > 0 && a.options == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} create: num_options > 0 but options is NULL",
             Family::kName);
      }
      std::unique_ptr<Transport> transport = Family::create(a);
      if (!transport) {
        fail(FERRY_STATUS_INTERNAL, "{} create: no instance was created", Family::kName);
      }
      *out = reinterpret_cast<ferry_transport_t*>(transport.release());
    });
  }

  static void destroy(ferry_transport_t* transport) noexcept {
    delete reinterpret_cast<Transport*>(transport);
  }

  static void abort(ferry_transport_t* transport, const char* reason) noexcept {
    if (transport != nullptr) quietly([&] { self(transport).abort(reason); });
  }

  // --- peers (kPointToPoint, kBroadcast) -------------------------------------------------------

  static ferry_error_t* get_address(ferry_transport_t* transport, ferry_blob_t* out) noexcept {
    return into(transport, out, "get_address",
                [&](Transport& t) { return owned_blob(t.address()); });
  }

  static ferry_error_t* connect(ferry_transport_t* transport, const ferry_connect_args_t* args,
                                ferry_peer_t** out) noexcept {
    return into(transport, out, "connect", [&](Transport& t) {
      return t.connect(read_struct(args, FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns),
                                   "connect", "connect args"));
    });
  }

  static void disconnect(ferry_transport_t* transport, ferry_peer_t* peer) noexcept {
    if (transport != nullptr && peer != nullptr) quietly([&] { self(transport).disconnect(peer); });
  }

  template <bool kSend>
  static ferry_error_t* move_bucket(ferry_transport_t* transport, ferry_peer_t* peer,
                                    const ferry_bucket_io_t* bucket,
                                    ferry_request_t** out) noexcept {
    const char* call = kSend ? "send_bucket" : "recv_bucket";
    return into(transport, out, call, [&](Transport& t) {
      require(peer != nullptr, call, "peer");
      const auto b =
          read_struct(bucket, FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns), call, "bucket");
      if constexpr (kSend) {
        return t.send_bucket(peer, b);
      } else {
        return t.recv_bucket(peer, b);
      }
    });
  }

  // --- memory (kMemory) ------------------------------------------------------------------------

  static ferry_error_t* register_memory(ferry_transport_t* transport,
                                        const ferry_memory_desc_t* desc,
                                        ferry_memory_t** out) noexcept {
    return into(transport, out, "register_memory", [&](Transport& t) {
      return t.register_memory(read_struct(desc, FERRY_STRUCT_SIZE(ferry_memory_desc_t, kind),
                                           "register_memory", "memory desc"));
    });
  }

  static ferry_error_t* alloc_memory(ferry_transport_t* transport, const ferry_memory_desc_t* desc,
                                     void** data_out, ferry_memory_t** out) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, "alloc_memory");
      clear_out(data_out, "alloc_memory");
      clear_out(out, "alloc_memory");
      const auto d = read_struct(desc, FERRY_STRUCT_SIZE(ferry_memory_desc_t, kind),
                                 "alloc_memory", "memory desc");
      if (d.base != nullptr || d.size == 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} alloc_memory: base must be NULL and size not 0",
             Family::kName);
      }
      const Allocation a = t.alloc_memory(d);
      *data_out = a.data;
      *out = reinterpret_cast<ferry_memory_t*>(a.memory);
    });
  }

  static void deregister_memory(ferry_transport_t* transport, ferry_memory_t* memory) noexcept {
    if (transport != nullptr && memory != nullptr) {
      quietly([&] { self(transport).deregister_memory(memory); });
    }
  }

  // --- direct write (kDirectWrite, kDeferredPuts) ----------------------------------------------

  static ferry_error_t* pack_key(ferry_transport_t* transport, ferry_memory_t* memory,
                                 ferry_blob_t* out) noexcept {
    return into(transport, out, "pack_key", [&](Transport& t) {
      require(memory != nullptr, "pack_key", "memory");
      return owned_blob(t.pack_key(memory));
    });
  }

  static ferry_error_t* put(ferry_transport_t* transport, ferry_peer_t* peer,
                            const ferry_put_args_t* args, ferry_request_t** out) noexcept {
    return into(transport, out, "put", [&](Transport& t) {
      require(peer != nullptr, "put", "peer");
      return t.put(peer, read_put(args, "put"));
    });
  }

  static ferry_error_t* flush(ferry_transport_t* transport, ferry_peer_t* peer,
                              std::int64_t deadline_ns, ferry_request_t** out) noexcept {
    return into(transport, out, "flush", [&](Transport& t) {
      require(peer != nullptr, "flush", "peer");
      return t.flush(peer, deadline_ns);
    });
  }

  static ferry_error_t* put_many(ferry_transport_t* transport, ferry_peer_t* peer,
                                 const ferry_put_args_t* const* args, size_t count) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, "put_many");
      require(peer != nullptr, "put_many", "peer");
      require(args != nullptr || count == 0, "put_many", "args");
      std::vector<ferry_put_args_t> puts;
      puts.reserve(count);
      for (size_t i = 0; i < count; ++i) puts.push_back(read_put(args[i], "put_many"));
      t.put_many(peer, std::span<const ferry_put_args_t>(puts));
    });
  }

  static ferry_error_t* prepare_puts(ferry_transport_t* transport, ferry_peer_t* peer,
                                     const ferry_blob_t* keys, size_t count,
                                     std::int64_t deadline_ns) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, "prepare_puts");
      require(peer != nullptr, "prepare_puts", "peer");
      require(keys != nullptr || count == 0, "prepare_puts", "keys");
      for (size_t i = 0; i < count; ++i) {
        if (keys[i].data == nullptr && keys[i].size != 0) {
          fail(FERRY_STATUS_INVALID_ARGUMENT, "{} prepare_puts: key {} has no bytes",
               Family::kName, i);
        }
      }
      t.prepare_puts(peer, std::span<const ferry_blob_t>(keys, count), deadline_ns);
    });
  }
  static ferry_error_t* map_peer_memory(ferry_transport_t* transport, ferry_peer_t* peer,
                                        const ferry_blob_t* key, std::uint64_t offset,
                                        std::uint64_t size, std::int64_t deadline_ns,
                                        const void** data_out) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, "map_peer_memory");
      require(peer != nullptr, "map_peer_memory", "peer");
      require(key != nullptr, "map_peer_memory", "key");
      require(data_out != nullptr, "map_peer_memory", "data_out");
      if (key->data == nullptr || key->size == 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} map_peer_memory: the key has no bytes",
             Family::kName);
      }
      *data_out = t.map_peer_memory(peer, *key, offset, size, deadline_ns);
    });
  }

  // --- requests (kAsync) -----------------------------------------------------------------------

  static ferry_error_t* request_test(ferry_transport_t* transport, ferry_request_t* request,
                                     int* done) noexcept {
    return into(transport, done, "request_test", [&](Transport& t) {
      require(request != nullptr, "request_test", "request");
      return t.request_test(request) ? 1 : 0;
    });
  }

  static ferry_error_t* request_wait(ferry_transport_t* transport, ferry_request_t* request,
                                     std::int64_t deadline_ns) noexcept {
    return guard([&] {
      Transport& t = transport_of(transport, "request_wait");
      require(request != nullptr, "request_wait", "request");
      t.request_wait(request, deadline_ns);
    });
  }

  static void request_free(ferry_transport_t* transport, ferry_request_t* request) noexcept {
    if (transport != nullptr && request != nullptr) {
      quietly([&] { self(transport).request_free(request); });
    }
  }

  // --- sources (kSource) -----------------------------------------------------------------------

  static ferry_error_t* source_open(ferry_transport_t* transport, const char* uri,
                                    ferry_source_t** out) noexcept {
    return into(transport, out, "source_open", [&](Transport& t) {
      require(uri != nullptr, "source_open", "uri");
      std::unique_ptr<Source> source = t.source_open(uri);
      return reinterpret_cast<ferry_source_t*>(source.release());
    });
  }

  static ferry_error_t* source_catalog(ferry_source_t* source, ferry_blob_t* out) noexcept {
    return guard([&] {
      require(source != nullptr, "source_catalog", "source");
      clear_out(out, "source_catalog");
      *out = owned_blob(reinterpret_cast<Source*>(source)->catalog());
    });
  }

  static ferry_error_t* source_read(ferry_source_t* source,
                                    ferry_source_read_args_t* args) noexcept {
    return guard([&] {
      require(source != nullptr, "source_read", "source");
      if (args == nullptr ||
          args->struct_size < FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written)) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "{} source_read: args is NULL or its struct_size is too small", Family::kName);
      }
      args->manifest = ferry_blob_t{};
      args->bytes_written = 0;
      if (args->dst == nullptr && args->dst_capacity > 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{} source_read: dst is NULL", Family::kName);
      }
      const ferry_source_read_args_t& in = *args;
      SourceBucket bucket = reinterpret_cast<Source*>(source)->read(in);
      args->manifest = owned_blob(std::move(bucket.manifest));
      args->bytes_written = bucket.bytes_written;
    });
  }

  static void source_close(ferry_source_t* source) noexcept {
    quietly([&] { delete reinterpret_cast<Source*>(source); });
  }

 public:
  // The table: the core always, each declared group's entries, NULL for the others.
  static constexpr ferry_transport_api_t kApi = [] {
    ferry_transport_api_t table{};
    table.struct_size = FERRY_STRUCT_SIZE(ferry_transport_api_t, map_peer_memory);
    table.get_caps = &get_caps;
    table.create = &create;
    table.destroy = &destroy;
    if constexpr (kPeers) {
      table.get_address = &get_address;
      table.connect = &connect;
      table.disconnect = &disconnect;
      table.send_bucket = &move_bucket<true>;
      table.recv_bucket = &move_bucket<false>;
    }
    if constexpr (kHasMemory) {
      table.register_memory = &register_memory;
      table.deregister_memory = &deregister_memory;
    }
    if constexpr (kHasDirectWrite) {
      table.pack_key = &pack_key;
      table.put = &put;
      table.flush = &flush;
    }
    if constexpr (kHasDeferredPuts) table.put_many = &put_many;
    if constexpr (kHasAsync) {
      table.request_test = &request_test;
      table.request_wait = &request_wait;
      table.request_free = &request_free;
    }
    if constexpr (kHasAbort) table.abort = &abort;
    if constexpr (kHasAlloc) table.alloc_memory = &alloc_memory;
    if constexpr (kHasPrepare) table.prepare_puts = &prepare_puts;
    if constexpr (kHasMapPeer) table.map_peer_memory = &map_peer_memory;
    if constexpr (kHasSource) {
      table.source_open = &source_open;
      table.source_catalog = &source_catalog;
      table.source_read = &source_read;
      table.source_close = &source_close;
    }
    return table;
  }();
};

}  // namespace ferry::sdk
