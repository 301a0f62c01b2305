/*
 * ferry/plugin.h: the stable C ABI between the ferry host and its plugins.
 *
 * A plugin is a shared object named libferry_transport_<name>.so (moves bucket bytes between a
 * trainer and a receiver) or libferry_model_<name>.so (turns manifest entries into copy plans
 * for one model family). It exports exactly one symbol, ferry_plugin_negotiate (see the end of
 * this file); everything else crosses through the const function tables declared here.
 *
 * Pure C99. No C++ types, no exceptions and no Cap'n Proto objects cross this boundary: tensor
 * metadata crosses as Cap'n Proto *bytes* (schema: ferry/tensor_meta.capnp).
 *
 * Conventions that hold for every declaration below unless its comment says otherwise:
 *
 *  - struct_size. Every struct starts with `size_t struct_size`, set by whoever fills the struct
 *    to FERRY_STRUCT_SIZE(type, last_field) as compiled into *its* copy of this header. A reader
 *    treats any field that lies past struct_size as absent (zero / NULL). Fields are only ever
 *    appended. A NULL function pointer in a table means "not implemented".
 *  - Errors. A function that can fail returns `ferry_error_t*`: NULL on success, otherwise an
 *    error object created through ferry_host_api_t.error_new. The *caller* owns a returned error
 *    and frees it with ferry_host_api_t.error_free (the host does this for calls it makes).
 *  - Pointers passed in are borrowed for the duration of the call unless the comment says the
 *    callee keeps them. Pointers returned as `// out` are owned as each comment says. Strings are
 *    NUL-terminated UTF-8.
 *  - Threading. "any thread" means the function may be called concurrently from several threads
 *    on the same object; "serialized" means the host never calls it concurrently for the same
 *    object (it may for different objects).
 *  - Times are nanoseconds (int64); a deadline is an absolute CLOCK_MONOTONIC time; sizes are
 *    bytes (uint64).
 *
 * Versioning rules (docs/plugin-abi.md, CHANGELOG.md): the major changes when anything is
 * deleted, retyped or reordered; the minor changes when a field, function or enum value is
 * appended. The host refuses a plugin of another major or of a minor older than the host's
 * minimum; the plugin may refuse a host in ferry_plugin_negotiate.
 */
#ifndef FERRY_PLUGIN_H_
#define FERRY_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_PLUGIN_ABI_MAJOR 1
#define FERRY_PLUGIN_ABI_MINOR 10

/* ABI 1.6: the fingerprint ferry computes and compares (docs/fingerprint.md), named in every
 * manifest that carries one and computed by a put with fingerprint_out. A new definition gets a
 * new name (and a minor version), never a changed one. */
#define FERRY_FINGERPRINT_ALGORITHM "xxh64-interleaved-v1"

/* Size of a struct measured to the end of its last field, for struct_size. */
#define FERRY_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#if defined(__GNUC__)
#define FERRY_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define FERRY_PLUGIN_EXPORT
#endif

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef enum ferry_status_code {
  FERRY_STATUS_OK = 0,
  FERRY_STATUS_INVALID_ARGUMENT = 1, /* the caller passed something malformed */
  FERRY_STATUS_UNIMPLEMENTED = 2,    /* optional feature not provided */
  FERRY_STATUS_INCOMPATIBLE = 3,     /* ABI, protocol or layout mismatch */
  FERRY_STATUS_NOT_FOUND = 4,        /* a named file, tensor or peer does not exist */
  FERRY_STATUS_IO = 5,               /* the operating system refused a read/write */
  FERRY_STATUS_CORRUPT_DATA = 6,     /* bytes failed validation (file, manifest, fingerprint) */
  FERRY_STATUS_TIMEOUT = 7,          /* a deadline passed; the message names the peer and phase */
  FERRY_STATUS_PEER_FAILED = 8,      /* the remote side died or reported an error */
  FERRY_STATUS_ABORTED = 9,          /* the operation was aborted on request */
  FERRY_STATUS_OUT_OF_MEMORY = 10,   /* allocation or registration failed for lack of memory */
  FERRY_STATUS_FAILED_PRECONDITION = 11, /* called in the wrong state (e.g. resume twice) */
  FERRY_STATUS_INTERNAL = 12,        /* a bug; the message says where */
  FERRY_STATUS_END_OF_STREAM = 13    /* a source has no more buckets (not a failure) */
} ferry_status_code_t;

/* Opaque error object. Created by ferry_host_api_t.error_new, freed by error_free. */
typedef struct ferry_error ferry_error_t;

/* ------------------------------------------------------------------------------------------ */
/* Data types and tensor descriptions                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Element types. Values equal the DType enum ordinals of tensor_meta.capnp. */
typedef enum ferry_dtype {
  FERRY_DTYPE_INVALID = 0,
  FERRY_DTYPE_F64 = 1,
  FERRY_DTYPE_F32 = 2,
  FERRY_DTYPE_F16 = 3,
  FERRY_DTYPE_BF16 = 4,
  FERRY_DTYPE_I64 = 5,
  FERRY_DTYPE_I32 = 6,
  FERRY_DTYPE_I16 = 7,
  FERRY_DTYPE_I8 = 8,
  FERRY_DTYPE_U8 = 9,
  FERRY_DTYPE_BOOL = 10,
  FERRY_DTYPE_F8_E4M3 = 11,
  FERRY_DTYPE_F8_E5M2 = 12
} ferry_dtype_t;

#define FERRY_MAX_DIMS 8

/* The bucket layout, part of the wire contract since ABI 1.0: whoever packs a bucket (a sender,
 * a source transport) starts each tensor at a multiple of FERRY_BUCKET_ALIGNMENT bytes from the
 * bucket's start (the first at 0; the padding between tensors carries no data), and whoever
 * allocates bucket memory (staging slots) aligns its start to it, so every tensor in a bucket is
 * that aligned in memory (vectorized kernels and DMA copies rely on it). Changing it is a major
 * change. */
#define FERRY_BUCKET_ALIGNMENT 256

/* Memory kinds a transport can read from or write to. Bit flags. */
typedef enum ferry_memory_kind {
  FERRY_MEMORY_HOST = 1u << 0,   /* pageable host memory */
  FERRY_MEMORY_PINNED = 1u << 1, /* page-locked host memory (cudaHostRegister / cudaHostAlloc) */
  FERRY_MEMORY_CUDA = 1u << 2    /* CUDA device memory (including VMM mappings) */
} ferry_memory_kind_t;

/* One tensor: a name, an element type and a shape. Used for checkpoint tensors (manifest
 * entries) and for the receiver's parameters (target layout). */
typedef struct ferry_tensor_desc {
  size_t struct_size;
  const char* name; /* borrowed; valid as long as the struct that holds it */
  ferry_dtype_t dtype;
  uint32_t ndim; /* <= FERRY_MAX_DIMS */
  uint64_t shape[FERRY_MAX_DIMS];
} ferry_tensor_desc_t;

/* An opaque byte blob with its deleter: rendezvous data (NCCL unique id, UCX worker address,
 * remote keys, IPC handles) and serialized Cap'n Proto messages. The host never interprets a
 * transport's blobs; it carries them over its control channel to the peer's plugin.
 * Ownership: whoever receives a filled blob as `// out` calls blob->release(blob->data,
 * blob->release_ctx) once when done (release may be NULL for static data). */
typedef struct ferry_blob {
  size_t struct_size;
  const uint8_t* data;
  uint64_t size;
  void (*release)(const uint8_t* data, void* release_ctx);
  void* release_ctx;
} ferry_blob_t;

/* ------------------------------------------------------------------------------------------ */
/* Services the host gives every plugin                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum ferry_log_level {
  FERRY_LOG_TRACE = 0,
  FERRY_LOG_DEBUG = 1,
  FERRY_LOG_INFO = 2,
  FERRY_LOG_WARN = 3,
  FERRY_LOG_ERROR = 4
} ferry_log_level_t;

/* Lives from ferry_plugin_negotiate until the plugin is unloaded. All functions: any thread. */
typedef struct ferry_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  /* Creates an error; `message` is copied. Never returns NULL (allocation failure yields a
   * static out-of-memory error that error_free ignores). */
  ferry_error_t* (*error_new)(ferry_status_code_t code, const char* message);
  /* Frees an error. NULL is a no-op. */
  void (*error_free)(ferry_error_t* error);
  /* Accessors; the message is owned by the error and valid until error_free. */
  ferry_status_code_t (*error_code)(const ferry_error_t* error);
  const char* (*error_message)(const ferry_error_t* error);
  /* Logs through the host's logger under the plugin's name; `message` is copied. */
  void (*log)(ferry_log_level_t level, const char* plugin_name, const char* message);
} ferry_host_api_t;

/* Key/value options from the config section of this plugin ([transport.<name>] or
 * [model.<name>]), as strings. The plugin rejects unknown keys with INVALID_ARGUMENT naming the
 * key (ABI 1.3: the keys it declares in ferry_plugin_negotiation_t.option_keys are exactly the
 * ones it accepts). Borrowed for the duration of the call. */
typedef struct ferry_option {
  const char* key;
  const char* value;
} ferry_option_t;

/* ------------------------------------------------------------------------------------------ */
/* Transport plugins                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Capability flags (ferry_transport_caps_t.flags). */
typedef enum ferry_transport_cap {
  FERRY_TRANSPORT_CAP_POINT_TO_POINT = 1u << 0, /* one sender, one receiver per connection */
  FERRY_TRANSPORT_CAP_BROADCAST = 1u << 1,      /* one sender, a group of receivers (NCCL) */
  FERRY_TRANSPORT_CAP_SAME_NODE_ONLY = 1u << 2, /* peers must share a host (CUDA IPC) */
  FERRY_TRANSPORT_CAP_DIRECT_WRITE = 1u << 3,   /* sender can put into receiver-registered memory */
  FERRY_TRANSPORT_CAP_ASYNC = 1u << 4,          /* send/recv return before completion */
  FERRY_TRANSPORT_CAP_SOURCE = 1u << 5,         /* produces buckets itself from a URI (disk) */
  /* ABI 1.1: a put from device memory can fingerprint what it writes (ferry_put_args_t
   * .fingerprint_out). The host asks for it only from plugins of minor >= 6, whose fingerprint
   * is FERRY_FINGERPRINT_ALGORITHM (earlier minors computed xxh64-chunked-v1). */
  FERRY_TRANSPORT_CAP_PUT_FINGERPRINT = 1u << 6,
  /* ABI 1.2: puts are deferred. A put only queues its write: nothing reaches the peer's memory
   * before the host issues a flush to that peer, whose request then reports the outcome of every
   * put it covers; a put may set its *out to NULL. Puts not yet flushed are dropped, unwritten,
   * when the peer is disconnected or the instance destroyed. (The host may then queue writes
   * before the receiver is ready for them, and flush once it is.) */
  FERRY_TRANSPORT_CAP_PUT_DEFERRED = 1u << 7,
  /* ABI 1.4: the two peers must be different processes (CUDA IPC: a process cannot open the
   * handles it exported itself). The host does not choose this transport for a receiver embedded
   * in the sending process. */
  FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES = 1u << 8,
  /* ABI 1.5 (with CAP_BROADCAST): the transport meets its group itself, at a rendezvous the
   * group's rank 0 serves and the host only names (torch.distributed's TCPStore, as a trainer's
   * `init_process_group(init_method="tcp://host:port")` starts it). The host runs no rendezvous
   * of its own and never calls get_address: connect receives one remote address, the text
   * "host:port" (no NUL), with peer_name the group's name. Each send_bucket / recv_bucket is one
   * collective broadcast from rank 0 of exactly data.size bytes, matched with the peers' calls
   * in the order issued (the trainer's `torch.distributed.broadcast`, one per tensor or per
   * flattened bucket). */
  FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS = 1u << 9,
  /* ABI 1.8 (with CAP_PUT_FINGERPRINT): a fingerprinting put can also hand back the hash of each
   * 1 MiB chunk of what it writes, numbered as chunks of a longer range (ferry_put_args_t
   * .chunk_hashes_out), so that a receiver makes the fingerprint of a parameter written in
   * pieces from its pieces' chunk hashes instead of reading it again. */
  FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES = 1u << 10
} ferry_transport_cap_t;

typedef struct ferry_transport_caps {
  size_t struct_size;
  uint32_t flags;        /* ferry_transport_cap_t bits */
  uint32_t memory_kinds; /* ferry_memory_kind_t bits it can read/write directly */
  uint64_t preferred_bucket_bytes; /* 0: no preference */
  uint32_t max_inflight_buckets;   /* how many buckets may be outstanding; 0 means 1 */
} ferry_transport_caps_t;

typedef struct ferry_transport ferry_transport_t; /* one plugin instance (e.g. a UCX worker) */
typedef struct ferry_peer ferry_peer_t;           /* a connected peer or group */
typedef struct ferry_memory ferry_memory_t;       /* a registered memory range */
typedef struct ferry_request ferry_request_t;     /* an in-flight send/recv/put */
typedef struct ferry_source ferry_source_t;       /* an open source of buckets (a checkpoint) */

typedef enum ferry_role { FERRY_ROLE_SENDER = 1, FERRY_ROLE_RECEIVER = 2 } ferry_role_t;

typedef struct ferry_transport_create_args {
  size_t struct_size;
  ferry_role_t role;
  const ferry_option_t* options; /* borrowed */
  size_t num_options;
  int32_t device; /* CUDA device ordinal, or -1 for CPU-only */
} ferry_transport_create_args_t;

typedef struct ferry_memory_desc {
  size_t struct_size;
  void* base;
  uint64_t size;
  ferry_memory_kind_t kind;
  int32_t device; /* for FERRY_MEMORY_CUDA */
} ferry_memory_desc_t;

/* A contiguous range of bytes in registered memory. */
typedef struct ferry_memory_range {
  size_t struct_size;
  ferry_memory_t* memory; /* borrowed registration */
  uint64_t offset;
  uint64_t size;
} ferry_memory_range_t;

typedef struct ferry_connect_args {
  size_t struct_size;
  const ferry_blob_t* remote_addresses; /* one per remote rank, from get_address on that side */
  size_t num_remote;
  uint32_t local_rank;  /* rank in the group (broadcast); 0 for point-to-point */
  uint32_t group_size;  /* 2 for point-to-point */
  const char* peer_name; /* for error messages, e.g. "receiver 10.0.0.2:8000" */
  int64_t deadline_ns;
} ferry_connect_args_t;

/* A bucket on the sender side, or the place one is received into on the receiver side. */
typedef struct ferry_bucket_io {
  size_t struct_size;
  ferry_memory_range_t data; /* the bucket bytes */
  uint32_t bucket_index;
  int64_t deadline_ns;
} ferry_bucket_io_t;

/* A direct write: local bytes into memory the peer registered (remote key from pack_key). */
typedef struct ferry_put_args {
  size_t struct_size;
  ferry_memory_range_t local;
  const ferry_blob_t* remote_key; /* from the peer's pack_key, carried by the host */
  uint64_t remote_offset;
  int64_t deadline_ns;
  /* ABI 1.1, optional (CAP_PUT_FINGERPRINT; only for a local range in device memory). When
   * non-NULL, the transport also computes the fingerprint of the bytes it writes
   * (FERRY_FINGERPRINT_ALGORITHM, docs/fingerprint.md) from the words as it stores them, so the
   * data is read once, and stores it here (host memory the caller keeps valid) before the flush that
   * covers this put completes. Undefined when the put or the flush fails. */
  uint64_t* fingerprint_out;
  /* ABI 1.8, optional (CAP_PUT_CHUNK_HASHES; only with fingerprint_out). When non-NULL, the
   * transport also stores the hash of each 1 MiB chunk of the bytes it writes, ceil(size / 1 MiB)
   * of them in order, here (host memory the caller keeps valid) before the flush that covers
   * this put completes. The chunks are numbered from chunk_index_base (docs/fingerprint.md: the
   * index seeds each chunk's accumulators), as chunks chunk_index_base, chunk_index_base + 1, ..
   * of a longer range the put writes a piece of, at byte chunk_index_base * 1 MiB of it;
   * *fingerprint_out is then XXH64 of these hashes seeded with the size (the fingerprint of the
   * bytes when chunk_index_base is 0). Undefined when the put or the flush fails. */
  uint64_t* chunk_hashes_out;
  uint64_t chunk_index_base;
} ferry_put_args_t;

/* A request to a source (CAP_SOURCE): fill `dst` with the next tensors that fit. */
typedef struct ferry_source_read_args {
  size_t struct_size;
  void* dst;           /* host memory the host owns; the plugin writes [0, dst_capacity) */
  uint64_t dst_capacity;
  uint32_t num_threads; /* parallel readers the plugin may use; 0: its choice */
  int64_t deadline_ns;
  ferry_blob_t manifest; /* out: tensor_meta.capnp Manifest of what was written; caller releases */
  uint64_t bytes_written; /* out */
} ferry_source_read_args_t;

/* The transport function table. Returned (static, const) from ferry_plugin_negotiate; valid until
 * the plugin is unloaded. Functions marked optional may be NULL. */
typedef struct ferry_transport_api {
  size_t struct_size;

  /* Required. Fills caps (caller sets caps->struct_size). Any thread; no instance needed. */
  ferry_error_t* (*get_caps)(ferry_transport_caps_t* caps);

  /* Required. Creates an instance; *out owned by the caller, freed with destroy. Any thread. */
  ferry_error_t* (*create)(const ferry_transport_create_args_t* args, ferry_transport_t** out);
  /* Required. Destroys an instance and everything it created (peers, registrations, requests
   * not yet freed are cancelled). Serialized; no other call on the instance may be in flight. */
  void (*destroy)(ferry_transport_t* transport);

  /* Optional (point-to-point / broadcast). This side's rendezvous blob (worker address, NCCL
   * unique id on rank 0, IPC socket path). *out released by the caller. Serialized. */
  ferry_error_t* (*get_address)(ferry_transport_t* transport, ferry_blob_t* out);
  /* Optional. Connects to the peer(s) whose addresses the host carried over. *out owned by the
   * caller, freed with disconnect. Blocks until connected or args->deadline_ns. Serialized. */
  ferry_error_t* (*connect)(ferry_transport_t* transport, const ferry_connect_args_t* args,
                            ferry_peer_t** out);
  /* Optional. Frees a peer. Serialized. */
  void (*disconnect)(ferry_transport_t* transport, ferry_peer_t* peer);

  /* Optional. Registers memory for send/recv/put. The range must stay valid until deregister.
   * *out owned by the caller. Serialized. */
  ferry_error_t* (*register_memory)(ferry_transport_t* transport, const ferry_memory_desc_t* desc,
                                    ferry_memory_t** out);
  /* Optional (CAP_DIRECT_WRITE). The remote key a peer needs to put into `memory`.
   * *out released by the caller. Serialized. */
  ferry_error_t* (*pack_key)(ferry_transport_t* transport, ferry_memory_t* memory,
                             ferry_blob_t* out);
  /* Optional. Serialized. */
  void (*deregister_memory)(ferry_transport_t* transport, ferry_memory_t* memory);

  /* Optional. Sends one bucket to the peer. With CAP_ASYNC it may return before completion;
   * *out (may be set to NULL when already complete) is owned by the caller and freed with
   * request_free. The bucket memory must not change until the request completes. Serialized per
   * peer. */
  ferry_error_t* (*send_bucket)(ferry_transport_t* transport, ferry_peer_t* peer,
                                const ferry_bucket_io_t* bucket, ferry_request_t** out);
  /* Optional. Receives one bucket into bucket->data. Same ownership as send_bucket. */
  ferry_error_t* (*recv_bucket)(ferry_transport_t* transport, ferry_peer_t* peer,
                                const ferry_bucket_io_t* bucket, ferry_request_t** out);
  /* Optional (CAP_DIRECT_WRITE). Writes local bytes into the peer's memory (with
   * CAP_PUT_DEFERRED: queues the write until the next flush; *out may be set to NULL). */
  ferry_error_t* (*put)(ferry_transport_t* transport, ferry_peer_t* peer,
                        const ferry_put_args_t* args, ferry_request_t** out);
  /* Optional (CAP_DIRECT_WRITE). Completes when every put issued to peer so far is visible in
   * the peer's memory. Must be called before the host acknowledges a bucket. */
  ferry_error_t* (*flush)(ferry_transport_t* transport, ferry_peer_t* peer, int64_t deadline_ns,
                          ferry_request_t** out);

  /* Optional with CAP_ASYNC. Sets *done to 1 when the request finished; returns the request's
   * error if it failed. Any thread, but not concurrently for the same request. */
  ferry_error_t* (*request_test)(ferry_transport_t* transport, ferry_request_t* request,
                                 int* done);
  /* Optional with CAP_ASYNC. Blocks until the request finishes or deadline_ns passes (then
   * TIMEOUT, the request stays valid and may be waited on again or freed). */
  ferry_error_t* (*request_wait)(ferry_transport_t* transport, ferry_request_t* request,
                                 int64_t deadline_ns);
  /* Optional with CAP_ASYNC. Frees a request; cancels it if still running. */
  void (*request_free)(ferry_transport_t* transport, ferry_request_t* request);

  /* Optional. Aborts everything in flight on this instance: pending requests complete with
   * ABORTED, blocked calls return. Any thread (this is how the host breaks a hang). `reason` is
   * copied into the errors. */
  void (*abort)(ferry_transport_t* transport, const char* reason);

  /* Optional (CAP_SOURCE). Opens a source such as a checkpoint path. *out owned by the caller,
   * closed with source_close. Serialized. */
  ferry_error_t* (*source_open)(ferry_transport_t* transport, const char* uri,
                                ferry_source_t** out);
  /* Optional (CAP_SOURCE). The catalog of every tensor in the source: a tensor_meta.capnp
   * Manifest with bucketCount = 0 and offsets relative to nothing (size only). *out released by
   * the caller. Serialized per source. */
  ferry_error_t* (*source_catalog)(ferry_source_t* source, ferry_blob_t* out);
  /* Optional (CAP_SOURCE). Fills args->dst with the next whole tensors in catalog order that fit
   * and describes them in args->manifest. Returns END_OF_STREAM when nothing is left, and
   * INVALID_ARGUMENT naming the tensor when one tensor is larger than dst_capacity.
   * Serialized per source. */
  ferry_error_t* (*source_read)(ferry_source_t* source, ferry_source_read_args_t* args);
  /* Optional (CAP_SOURCE). Serialized. */
  void (*source_close)(ferry_source_t* source);

  /* ABI 1.2, optional (only with CAP_PUT_DEFERRED). Queues `count` puts to `peer` in order, as
   * `count` calls of put would, with no requests: the next flush to the peer reports them. A host
   * with thousands of tensors per flush makes one call instead of thousands. All or nothing: on
   * an error none of them is queued. `args` holds `count` pointers (each struct carries its own
   * struct_size). */
  ferry_error_t* (*put_many)(ferry_transport_t* transport, ferry_peer_t* peer,
                             const ferry_put_args_t* const* args, size_t count);

  /* ABI 1.7, optional (with register_memory and deregister_memory). Allocates desc->size bytes of
   * memory of desc->kind in a place the transport chooses and registers them, as register_memory
   * would register memory the host allocated: memory a peer reaches faster than the host's own
   * (UCX: ucp_mem_map with UCP_MEM_MAP_ALLOCATE, which the shared-memory transports map into the
   * peer, so a put there is a plain copy). desc->base must be NULL. *data_out (out): the first
   * byte, aligned to at least FERRY_BUCKET_ALIGNMENT; its contents are unspecified. The memory is
   * the transport's: it stays valid until deregister_memory(*out) frees it (the host never frees
   * it itself), and it goes when the instance is destroyed. A kind the transport does not
   * allocate is UNIMPLEMENTED, and the host then allocates and registers the memory itself, as
   * it does for every plugin that leaves this NULL or is of minor < 7. Serialized. */
  ferry_error_t* (*alloc_memory)(ferry_transport_t* transport, const ferry_memory_desc_t* desc,
                                 void** data_out, ferry_memory_t** out);

  /* ABI 1.9, optional (with put). The peer's memory that later puts will write, one key per
   * registration (each from the peer's pack_key): the transport may do now what the first put
   * into each would do before it can start (cuda_ipc: import the memory and map it), so that the
   * puts issued later start at once. It writes nothing and queues nothing. A key that a put
   * could not use fails it as that put would (a stale key: FAILED_PRECONDITION); a peer that
   * is gone: PEER_FAILED. The host calls it where it has time to spare before the puts: when
   * a kept session rejoins after the peer released and resumed its memory, while the push still
   * waits for the kernels that produce its tensors. Serialized per peer with put and put_many. */
  ferry_error_t* (*prepare_puts)(ferry_transport_t* transport, ferry_peer_t* peer,
                                 const ferry_blob_t* keys, size_t count, int64_t deadline_ns);

  /* ABI 1.10, optional (with pack_key). Where this process reads [offset, offset + size) of
   * memory the peer registered (the key from the peer's pack_key, carried by the host): a pointer
   * to those bytes, readable by kernels this process runs on the transport's device (cuda_ipc:
   * the peer's CUDA memory imported and mapped here). A receiver then runs its plan straight from
   * the sender's tensors, with no copy into its slots first. The mapping is the transport's: it
   * stays valid until the peer is disconnected or the instance destroyed, and mapping the same
   * key again returns the same address. The host reads it only while the peer keeps the memory
   * registered and its bytes final (the session protocol says when). A stale key (the peer
   * deregistered the memory): FAILED_PRECONDITION; a range outside the registration:
   * INVALID_ARGUMENT; a peer that is gone: PEER_FAILED; memory this process cannot map (a peer on
   * another host): UNIMPLEMENTED. *data_out is left unchanged on error. Serialized per peer. */
  ferry_error_t* (*map_peer_memory)(ferry_transport_t* transport, ferry_peer_t* peer,
                                    const ferry_blob_t* key, uint64_t offset, uint64_t size,
                                    int64_t deadline_ns, const void** data_out);
} ferry_transport_api_t;

/* ------------------------------------------------------------------------------------------ */
/* Model plugins: plans                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* What an operation does to the elements it moves. */
typedef enum ferry_transform {
  FERRY_TRANSFORM_COPY = 0,          /* bytes as they are; src and dst dtype equal */
  FERRY_TRANSFORM_CAST = 1,          /* element-wise conversion src dtype -> dst dtype (RNE) */
  FERRY_TRANSFORM_FP8_BLOCK_QUANT = 2 /* bf16/f16/f32 -> F8_E4M3 with 128x128 block scales
                                        written to scale_param (float32 dequant multipliers) */
} ferry_transform_t;

/* Flags on an operation. */
typedef enum ferry_op_flag {
  FERRY_OP_SCALE_UE8M0 = 1u << 0 /* FP8: round each block scale up to a power of two */
} ferry_op_flag_t;

/* One copy operation of a plan: a 2-D strided block of `rows` x `cols` elements read from the
 * bucket and written into one destination parameter. Every N-dimensional slice the model
 * families need (a shard on any dimension, a part of a fused tensor, an expert of a stacked one)
 * is one such block: rows = product of the dims before the sliced one, cols = the slice length
 * times the product of the dims after it. */
typedef struct ferry_plan_op {
  size_t struct_size;
  uint32_t src_tensor;   /* index of the manifest entry in the bucket */
  ferry_dtype_t src_dtype;
  uint64_t src_offset;   /* element offset from the entry's first element */
  uint64_t src_row_stride; /* elements between row starts in the source */
  uint32_t dst_param;    /* index into the target layout */
  ferry_dtype_t dst_dtype;
  uint64_t dst_offset;   /* element offset from the parameter's first element */
  uint64_t dst_row_stride;
  uint64_t rows;
  uint64_t cols;
  ferry_transform_t transform;
  uint32_t flags;        /* ferry_op_flag_t bits */
  uint32_t scale_param;  /* FP8: index of the float32 scale parameter; else unused */
} ferry_plan_op_t;

/* A plan: the operations for one manifest entry (or one whole bucket). Allocated by the plugin,
 * freed with ferry_model_api_t.plan_free. `ops` is valid until then. */
typedef struct ferry_plan {
  size_t struct_size;
  const ferry_plan_op_t* ops;
  size_t num_ops;
} ferry_plan_t;

typedef struct ferry_model ferry_model_t;

typedef struct ferry_model_create_args {
  size_t struct_size;
  const char* layout;       /* e.g. "engine" (fused qkv/gate_up) or "hf" (identity) */
  uint32_t tp_rank, tp_size; /* tensor parallelism */
  uint32_t ep_rank, ep_size; /* expert parallelism (MoE) */
  const char* config_json;   /* the checkpoint's config.json text, or NULL */
  const ferry_option_t* options; /* from [model.<name>]; borrowed */
  size_t num_options;
} ferry_model_create_args_t;

/* The receiver's parameters (the target layout), allocated by the plugin. `params` (and the
 * names they point to) are valid until layout_free. */
typedef struct ferry_layout {
  size_t struct_size;
  const ferry_tensor_desc_t* params;
  size_t num_params;
} ferry_layout_t;

typedef struct ferry_model_api {
  size_t struct_size;
  /* Required. Creates an instance; *out freed with destroy. Any thread. */
  ferry_error_t* (*create)(const ferry_model_create_args_t* args, ferry_model_t** out);
  /* Required. Serialized. */
  void (*destroy)(ferry_model_t* model);
  /* Required. Given every checkpoint tensor (the full, unsharded catalog), returns this rank's
   * parameters. Fails with NOT_FOUND / INVALID_ARGUMENT listing the missing, unknown or
   * mis-shaped tensors by name. *out freed with layout_free. Serialized. */
  ferry_error_t* (*target_layout)(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint,
                                  size_t num_checkpoint, ferry_layout_t** out);
  /* Required. */
  void (*layout_free)(ferry_model_t* model, ferry_layout_t* layout);
  /* Required. The operations that apply the checkpoint tensors `entries` (one bucket's manifest
   * entries, in order) to the layout returned by target_layout. An entry this rank does not need
   * yields no operation. The host caches the plan by manifest signature, so the plugin must be a
   * pure function of (entries, layout). *out freed with plan_free. Any thread. */
  ferry_error_t* (*plan)(ferry_model_t* model, const ferry_tensor_desc_t* entries,
                         size_t num_entries, ferry_plan_t** out);
  /* Required. Any thread. */
  void (*plan_free)(ferry_model_t* model, ferry_plan_t* plan);
  /* Optional. Maps a checkpoint tensor name to (parameter, 2-D block) so a receiver can answer
   * get_weights_by_name with the checkpoint's values: the returned single-op plan reads the
   * parameter region that holds `name`. NOT_FOUND for an unknown name. *out freed with
   * plan_free. Any thread. */
  ferry_error_t* (*locate)(ferry_model_t* model, const ferry_tensor_desc_t* checkpoint_tensor,
                           ferry_plan_t** out);
} ferry_model_api_t;

/* ------------------------------------------------------------------------------------------ */
/* The entry symbol                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef enum ferry_plugin_kind {
  FERRY_PLUGIN_TRANSPORT = 1,
  FERRY_PLUGIN_MODEL = 2
} ferry_plugin_kind_t;

/* In/out negotiation. The host fills the `in` fields and struct_size; the plugin fills the `out`
 * fields it knows (reading struct_size to see which exist) and returns NULL to accept, or an error
 * (INCOMPATIBLE with a reason) to refuse the host. The host then checks the plugin's answer and
 * may refuse it in turn (other major, minor below the host's minimum, name not matching the file,
 * short or NULL tables). */
typedef struct ferry_plugin_negotiation {
  size_t struct_size;
  /* in */
  uint32_t host_abi_major;
  uint32_t host_abi_minor;
  const ferry_host_api_t* host; /* valid until the plugin is unloaded */
  /* out */
  uint32_t plugin_abi_major;
  uint32_t plugin_abi_minor;
  ferry_plugin_kind_t kind;
  const char* name;           /* static; must equal <name> in the file name */
  const char* version;        /* static; the plugin's own version, free form */
  const void* api;            /* static; const ferry_transport_api_t* or const ferry_model_api_t* */
  /* ABI 1.3, out, optional: the option keys `create` accepts, as a static NULL-terminated array
   * of static strings (an array holding only NULL: it takes no options). The host refuses a
   * config section of this plugin holding any other key before it creates anything, even when
   * the plugin is not the one in use. NULL: not declared; the plugin's create is then the only
   * check. */
  const char* const* option_keys;
} ferry_plugin_negotiation_t;

/* Exported by every plugin. Called once per load, before anything else, from one thread. */
typedef ferry_error_t* (*ferry_plugin_negotiate_fn)(ferry_plugin_negotiation_t* negotiation);
#define FERRY_PLUGIN_ENTRY_SYMBOL "ferry_plugin_negotiate"

FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(ferry_plugin_negotiation_t* negotiation);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERRY_PLUGIN_H_ */
