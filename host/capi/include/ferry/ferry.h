/*
 * ferry/ferry.h: the stable C API of libferry.so: a *sender* that pushes versioned weight updates
 * from a trainer to one or many receivers, and an *embedded receiver* that an inference engine runs
 * inside its own process to have updates written straight into its own parameter tensors.
 *
 * Pure C99, no C++ types. The conventions are those of the plugin ABI (ferry/plugin.h), whose
 * error type, status codes, dtypes and memory kinds this header reuses:
 *
 *  - struct_size. Every struct passed in starts with `size_t struct_size`, set by the caller to
 *    FERRY_STRUCT_SIZE(type, last_field) as compiled into its copy of this header. The library
 *    treats fields past struct_size as absent (zero / NULL), so a program built against an older
 *    minor version keeps working. Fields are only ever appended. Structs filled by the library
 *    (`// out`) are filled up to the smaller of the caller's struct_size and the library's size.
 *  - Errors. A function that can fail returns `ferry_error_t*`: NULL on success, otherwise an
 *    error object that the *caller* owns and frees with ferry_error_free. Its code is a
 *    ferry_status_code_t; its message is one line naming the thing (argument, tensor, receiver,
 *    key) and the rule that was broken.
 *  - Handles (ferry_sender_t, ferry_receiver_t, ferry_push_report_t, ferry_fingerprints_t) are
 *    opaque, created by a *_create (or a function with an `out` handle) and freed by the matching
 *    *_destroy / *_free. Freeing NULL is a no-op.
 *  - Pointers passed in are borrowed for the duration of the call unless the comment says the
 *    library keeps them. Strings are NUL-terminated UTF-8.
 *  - Threading is stated per function. "any thread" means concurrently with other calls on the
 *    same handle.
 *
 * Versioning: FERRY_API_MAJOR changes when anything is deleted, retyped or reordered;
 * FERRY_API_MINOR when a function, field or enum value is appended. ferry_api_version() reports
 * the library's numbers; a program checks at start that the major equals the one it was built with
 * and the minor is at least the one it needs. docs/c-api.md is the reference.
 */
#ifndef FERRY_FERRY_H_
#define FERRY_FERRY_H_

#include <stddef.h>
#include <stdint.h>

#include <ferry/dlpack.h>
#include <ferry/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_API_MAJOR 1
#define FERRY_API_MINOR 7

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

/* ------------------------------------------------------------------------------------------ */
/* Library, versions, errors                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The C API version of the loaded library (out pointers may be NULL). Any thread. */
FERRY_API void ferry_api_version(uint32_t* major, uint32_t* minor);

/* The ferry release ("0.1.0"). Static string. Any thread. */
FERRY_API const char* ferry_version_string(void);

/* The code of an error (FERRY_STATUS_OK for NULL). Any thread. */
FERRY_API ferry_status_code_t ferry_error_code(const ferry_error_t* error);

/* The message of an error ("" for NULL). Owned by the error; valid until ferry_error_free. */
FERRY_API const char* ferry_error_message(const ferry_error_t* error);

/* Frees an error returned by any ferry_* function. NULL is a no-op. Any thread. */
FERRY_API void ferry_error_free(ferry_error_t* error);

/* "INVALID_ARGUMENT", "TIMEOUT", ... ("UNKNOWN" for a value outside the enum). Static string. */
FERRY_API const char* ferry_status_name(ferry_status_code_t code);

/* Frees a string the library returned as an owned `char*` out parameter. NULL is a no-op. */
FERRY_API void ferry_string_free(char* string);

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Where a sender's or receiver's configuration (docs/config.md) comes from: the defaults, then a
 * TOML file *or* TOML text (not both), then each override in order ("update.bucket_bytes=1048576",
 * "receiver.model_family=identity", "plugin_dirs=['/opt/ferry/plugins']"), then the cross-key
 * checks. Every string is borrowed for the call. */
typedef struct ferry_config_source {
  size_t struct_size;
  const char* path;              /* TOML file, or NULL */
  const char* toml_text;         /* TOML text, or NULL */
  const char* const* overrides;  /* `num_overrides` "key.path=value" strings */
  size_t num_overrides;
} ferry_config_source_t;

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* One named tensor, given either as a DLPack DLTensor (`dlpack` non-NULL: dtype, ndim, shape,
 * strides, data and device are read from it and the fields below `dlpack` are ignored) or as a
 * plain view (`dlpack` NULL).
 *
 * Rules (each broken rule is INVALID_ARGUMENT naming the tensor): a non-empty name, unique within
 * one call; a dtype ferry knows (DLPack: int 8-64, uint 8, float 16-64, bfloat 16, bool, float8
 * e4m3fn / e5m2; lanes 1); ndim <= FERRY_MAX_DIMS; no negative extent; compact row-major memory
 * (strides NULL or equal to the row-major strides, in elements; a dimension of extent 1 may have
 * any stride); a non-NULL data pointer unless the tensor has no elements; a device ferry can read
 * (DLPack kDLCPU, kDLCUDAHost, kDLCUDA, kDLCUDAManaged).
 *
 * Ownership: the tensor memory is borrowed. A sender reads it during ferry_sender_push only. A
 * receiver keeps the pointer of a registered parameter and writes into it until the receiver is
 * destroyed (see ferry_receiver_register_param). */
typedef struct ferry_tensor {
  size_t struct_size;
  const char* name;        /* sender: the checkpoint name; receiver: the parameter name */
  const DLTensor* dlpack;  /* or NULL for a plain view */
  /* plain view (when dlpack is NULL) */
  ferry_dtype_t dtype;
  uint32_t ndim;
  const int64_t* shape;    /* ndim extents (may be NULL when ndim is 0) */
  const int64_t* strides;  /* ndim strides in elements, or NULL for compact row-major */
  void* data;              /* first element; a sender only reads it */
  ferry_memory_kind_t memory_kind; /* FERRY_MEMORY_HOST, _PINNED or _CUDA */
  int32_t device;          /* CUDA device ordinal for FERRY_MEMORY_CUDA, else ignored */
} ferry_tensor_t;

/* ------------------------------------------------------------------------------------------ */
/* Sender                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct ferry_sender ferry_sender_t;
typedef struct ferry_push_report ferry_push_report_t;

typedef struct ferry_sender_create_args {
  size_t struct_size;
  const ferry_config_source_t* config; /* NULL: the defaults only */
  /* Each receiver's address as a user knows it: the HOST:PORT of its control API (`ferry serve
   * --port`, or what ferry_receiver_serve returned). At least one. */
  const char* const* receivers;
  size_t num_receivers;
  /* Data transport: a transport plugin's name, "inline", or "auto" (per receiver, the first
   * plugin of the config's update.transport_preference whose capabilities fit the tensors and
   * the receiver, else inline). NULL or "": the config's update.transport ("auto"). */
  const char* transport;
  uint64_t bucket_bytes;       /* 0: the config's update.bucket_bytes */
  const char* token;           /* receivers' bearer token; NULL: the config's receiver.token */
  int64_t connect_timeout_ms;  /* 0: 10000 */
  int64_t bucket_timeout_ms;   /* 0: the config's update.bucket_timeout_ms */
  int64_t commit_timeout_ms;   /* 0: the config's update.commit_timeout_ms */
} ferry_sender_create_args_t;

/* Creates a sender. Nothing connects before the first push. Plugins are searched in the config's
 * plugin_dirs, then FERRY_PLUGIN_PATH, the install directory, the folder beside libferry.so
 * (ferry/plugins) and the build tree. *out freed with ferry_sender_destroy. Any thread.
 * Errors: INVALID_ARGUMENT (config, no receivers, a NULL/empty address), NOT_FOUND (config
 * file). */
FERRY_API ferry_error_t* ferry_sender_create(const ferry_sender_create_args_t* args,
                                             ferry_sender_t** out);

/* ------------------------------------------------------------------------------------------ */
/* Stream ordering (API 1.3; docs/c-api.md, "Stream ordering")                                 */
/* ------------------------------------------------------------------------------------------ */

/* How ferry orders its accesses to CUDA memory after the work other code queued on it. A sender
 * reads a pushed tensor only after the work that produced it is done (a trainer pushes right after
 * its optimizer step, whose kernels may still be queued); an embedded receiver writes a parameter
 * only after the engine's queued work on it is done. Handles are cudaStream_t / cudaEvent_t
 * values: 0 is the default stream of the calling thread's current device, 1 cudaStreamLegacy, 2
 * cudaStreamPerThread (such a stream is waited for on every device the memory is on); any other
 * stream on its own device. ferry waits on the calling thread (push) or the update's thread
 * (receiver) and restores the thread's current device. */
typedef enum ferry_stream_order {
  FERRY_ORDER_SYNC_DEVICES = 0, /* default: cudaDeviceSynchronize on every device the memory is on
                                   (right for any producer, whatever stream it used) */
  FERRY_ORDER_STREAMS = 1,      /* wait for everything queued on the named streams until then
                                   (the DLPack protocol: a producer's __dlpack__(stream=S) orders
                                   its pending work before S) */
  FERRY_ORDER_EVENTS = 2,       /* wait for the named events, recorded after the producing work
                                   (push only: an event is recorded once) */
  FERRY_ORDER_NONE = 3,         /* the caller made sure the memory is final (it synchronised) */
} ferry_stream_order_t;

/* A stream ferry owns on CUDA device `device` (created on first use, alive for the process) for
 * the DLPack protocol: pass it as `__dlpack__(stream=...)` to each producer of pushed tensors,
 * then name it in ferry_push_args_t with FERRY_ORDER_STREAMS. *stream gets the cudaStream_t
 * value. NOT_FOUND for a device that is not visible, UNIMPLEMENTED in a build without CUDA. Any
 * thread. */
FERRY_API ferry_error_t* ferry_cuda_consumer_stream(int32_t device, uintptr_t* stream);

/* API 1.6. Calls the deleter of each of the `count` DLPack managed tensors, in order, on the
 * calling thread (NULL entries and NULL deleters are skipped): a binding that took DLPack views
 * of many tensors for a push gives them back in one call. Each deleter must be called once: the
 * tensors are the caller's, and none may be used afterwards. A deleter may run without the
 * Python GIL (the DLPack Python specification: producers that need it take it), so a binding
 * calls this with the GIL released. Any thread. */
FERRY_API void ferry_dlpack_release(DLManagedTensor* const* tensors, size_t count);

typedef struct ferry_push_args {
  size_t struct_size;
  /* num_tensors pointers to named tensors (an array of pointers, so that each struct_size may
   * differ from the caller's sizeof); the tensors are read in place, not copied */
  const ferry_tensor_t* const* tensors;
  size_t num_tensors;
  uint64_t version;              /* the update's version number */
  const char* label;             /* weight_version string; NULL: the decimal version */
  /* API 1.3 (a caller's shorter struct_size means FERRY_ORDER_SYNC_DEVICES): how the push waits
   * for the work that produced its CUDA tensors, before anything reads them. */
  uint32_t order;                        /* a ferry_stream_order_t */
  const void* const* order_handles;      /* streams or events, per `order`; NULL otherwise */
  size_t num_order_handles;
} ferry_push_args_t;

/* Pushes one versioned update to every receiver and waits until each one committed or failed.
 * First it waits for the work that produced the CUDA tensors as args->order says (the default
 * synchronises their devices), so no byte is read before it is final.
 * Each receiver either commits `version` or keeps its previous version; the report says which,
 * per receiver, with the reason. Returns an error (and no report) only when the arguments are bad
 * (see ferry_tensor_t) or the sender cannot start; a receiver that fails is *not* an error of the
 * call: check ferry_push_report_all_committed. *report (may be NULL if not wanted) is freed with
 * ferry_push_report_free. The tensors must stay valid and unchanged until the call returns.
 * Threading: one push at a time per sender; ferry_sender_abort and ferry_sender_status may be
 * called from other threads meanwhile. */
FERRY_API ferry_error_t* ferry_sender_push(ferry_sender_t* sender, const ferry_push_args_t* args,
                                           ferry_push_report_t** report);

/* API 1.5: sharded pushes (docs/sharded.md). The block of one global tensor that a sender rank
 * holds: the ferry_tensor_t given with it (its shape is the block's extent per dimension, its
 * memory the block's own compact row-major elements) starts at `offsets` in the tensor of
 * `global_shape`; both have the tensor's ndim entries. */
typedef struct ferry_block {
  size_t struct_size;
  const uint64_t* global_shape;
  const uint64_t* offsets;
  int replica; /* 1: held here, but sent by the lowest rank holding the same block: declared to
                  the receivers, not sent */
} ferry_block_t;

typedef struct ferry_sharded_push_args {
  size_t struct_size;
  const ferry_push_args_t* push; /* the tensors (blocks), version, label and order */
  uint32_t rank;                 /* this sender's rank, < world */
  uint32_t world;                /* how many sender ranks make up the update */
  /* push->num_tensors pointers, one per tensor in order: its block, or NULL for the whole
   * tensor (held by this rank alone) */
  const ferry_block_t* const* blocks;
} ferry_sharded_push_args_t;

/* API 1.5: pushes this rank's part of a sharded update: each receiver assembles version
 * push->version from the sessions of all `world` ranks and commits it only when the ranks'
 * blocks tile every tensor exactly once and every block arrived verified; otherwise (a rank that
 * dies or misses its deadline, overlapping or missing blocks, ranks disagreeing on the version
 * or a tensor's shape) every rank's report names the rank and the tensor, and the receiver keeps
 * its previous version. Errors and threading as ferry_sender_push; INVALID_ARGUMENT for a block
 * outside its global shape or rank >= world. Sharded pushes never keep their sessions. */
FERRY_API ferry_error_t* ferry_sender_push_sharded(ferry_sender_t* sender,
                                                   const ferry_sharded_push_args_t* args,
                                                   ferry_push_report_t** report);

/* The per-receiver state of the last (or the running) push, as a report whose version and totals
 * are zero. *report freed with ferry_push_report_free. Any thread. */
FERRY_API ferry_error_t* ferry_sender_status(ferry_sender_t* sender, ferry_push_report_t** report);

/* Aborts a running push: every receiver that has not committed fails with ABORTED and keeps its
 * previous version. `reason` (may be NULL) is copied into the messages. No-op when no push runs.
 * Any thread. */
FERRY_API ferry_error_t* ferry_sender_abort(ferry_sender_t* sender, const char* reason);

/* Destroys a sender. No push may be in flight (abort it and let ferry_sender_push return first).
 * NULL is a no-op. */
FERRY_API void ferry_sender_destroy(ferry_sender_t* sender);

/* One receiver's outcome in a report. Strings are owned by the report. */
typedef struct ferry_receiver_result {
  size_t struct_size;
  const char* address;  /* out: as given in ferry_sender_create_args_t.receivers */
  int committed;        /* out: 1 when the receiver committed the version */
  const char* error;    /* out: why not ("" when committed); names the phase */
  uint64_t bytes;       /* out: payload bytes delivered */
  uint64_t buckets;     /* out */
  double seconds;       /* out */
  const char* transport; /* out: the data path used ("inline", "ucx", ...), "" if none yet */
  /* API 1.2 (a caller's shorter struct_size leaves them unwritten): */
  int direct;              /* out: 1 when the tensors went straight into the receiver's
                              parameters (direct delivery), 0 when through its staging slots */
  int writer_fingerprints; /* out: 1 when the copies fingerprinted what they wrote */
  int reused_session;      /* out: 1 when the push went through the session kept from the
                              previous push (no handshake), 0 when it opened one */
  /* API 1.5, a sharded push (zero / NULL otherwise): the payload bytes each rank moved to this
   * receiver (num_ranks entries, by rank; owned by the report) and the bytes of every tensor once
   * (what the receiver needed). */
  uint64_t needed_bytes;   /* out */
  size_t num_ranks;        /* out */
  const uint64_t* rank_bytes; /* out */
  /* API 1.7: 1 when the receiver read the tensors where they are and applied its plan from them
   * (reads in place: a plan that is not one whole copy per tensor, over a transport that maps
   * the sender's memory such as cuda_ipc), 0 otherwise. */
  int reads_in_place; /* out */
} ferry_receiver_result_t;

/* Report accessors. Any thread; the report is immutable. */
FERRY_API uint64_t ferry_push_report_version(const ferry_push_report_t* report);
FERRY_API uint64_t ferry_push_report_bytes(const ferry_push_report_t* report); /* per receiver */
FERRY_API double ferry_push_report_seconds(const ferry_push_report_t* report);
/* API 1.3: of ferry_push_report_seconds, the time spent waiting for the tensors' producers. */
FERRY_API double ferry_push_report_producer_wait_seconds(const ferry_push_report_t* report);
FERRY_API int ferry_push_report_all_committed(const ferry_push_report_t* report);
FERRY_API size_t ferry_push_report_num_receivers(const ferry_push_report_t* report);
/* Fills *out (caller sets out->struct_size). INVALID_ARGUMENT for an index out of range. */
FERRY_API ferry_error_t* ferry_push_report_receiver(const ferry_push_report_t* report,
                                                    size_t index, ferry_receiver_result_t* out);
FERRY_API void ferry_push_report_free(ferry_push_report_t* report);

/* ------------------------------------------------------------------------------------------ */
/* Embedded receiver                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct ferry_receiver ferry_receiver_t;
typedef struct ferry_fingerprints ferry_fingerprints_t;

/* Creates a receiver from a config (receiver.*, update.*, memory.* keys). When the config names no
 * receiver.model_family, "identity" is used: checkpoint names are the parameter names. *out freed
 * with ferry_receiver_destroy. Any thread. Errors: INVALID_ARGUMENT / NOT_FOUND for the config,
 * NOT_FOUND for a model plugin that cannot be found. */
FERRY_API ferry_error_t* ferry_receiver_create(const ferry_config_source_t* config,
                                               ferry_receiver_t** out);

/* Registers one engine-owned parameter: updates are written into its memory in place; ferry never
 * reallocates or frees it, and it must stay valid until ferry_receiver_destroy. Parameters are
 * collected until the first ferry_receiver_serve, which fixes the layout; registering afterwards
 * is FAILED_PRECONDITION. INVALID_ARGUMENT for a tensor that breaks a ferry_tensor_t rule or a
 * name registered twice. Serialized with the other calls on the receiver. */
FERRY_API ferry_error_t* ferry_receiver_register_param(ferry_receiver_t* receiver,
                                                       const ferry_tensor_t* param);

/* API 1.3: how every update waits for the engine's work on the registered parameters before it
 * writes into them (see ferry_stream_order_t): FERRY_ORDER_STREAMS with the streams the engine
 * runs on (the wait covers what was queued on them when the update begins), FERRY_ORDER_NONE when
 * the engine guarantees it is idle during updates, or FERRY_ORDER_SYNC_DEVICES (the default) to
 * synchronise the parameters' devices. Events are refused (an update may come many times). The
 * engine must not queue new work that reads the parameters while an update runs (health says
 * "updating"); its work queued after the update returned, or after the version it reads
 * advanced, sees the new weights. INVALID_ARGUMENT for a bad order. Serialized with updates. */
FERRY_API ferry_error_t* ferry_receiver_set_engine_order(ferry_receiver_t* receiver,
                                                        uint32_t order,
                                                        const void* const* handles,
                                                        size_t num_handles);

/* Starts serving in the background: the control API and the session protocol that senders use, on
 * host:port (host NULL: the config's receiver.host; port 0: a free port; port < 0: the config's
 * receiver.port). *bound_port (may be NULL) gets the port senders should be given. Updates arrive
 * on background threads and are applied in place. FAILED_PRECONDITION when already serving; IO
 * naming the address when it cannot bind. Serialized. */
FERRY_API ferry_error_t* ferry_receiver_serve(ferry_receiver_t* receiver, const char* host,
                                              int32_t port, int32_t* bound_port);

/* Stops serving: a running update is aborted (the previous version stays). No-op when not
 * serving. Serialized. */
FERRY_API ferry_error_t* ferry_receiver_stop(ferry_receiver_t* receiver);

/* release_memory_occupation / resume_memory_occupation by tag ("weights", "staging", ...);
 * num_tags 0 means every tag. A release first suspends the kept sessions of senders (they unmap
 * what they imported). Engine-owned parameters are never freed by ferry: releasing their tag is
 * the engine saying it is about to free or unmap that memory itself (call it before), resuming
 * it that the memory is mapped again at the same addresses (call it after); with
 * memory.weights_policy "backup" ferry saves them to its host mirror and writes them back.
 * Errors name the unknown tag or the double release/resume (FAILED_PRECONDITION). Any thread. */
FERRY_API ferry_error_t* ferry_receiver_release(ferry_receiver_t* receiver,
                                                const char* const* tags, size_t num_tags);
FERRY_API ferry_error_t* ferry_receiver_resume(ferry_receiver_t* receiver,
                                               const char* const* tags, size_t num_tags);

/* The published version: its number (0 before the first commit) and, when label is not NULL, its
 * weight_version string in *label (freed with ferry_string_free). Any thread; never blocks
 * behind a running update. */
FERRY_API ferry_error_t* ferry_receiver_version(ferry_receiver_t* receiver, uint64_t* number,
                                                char** label);

/* Health: *ready 1 when serving committed weights; *state (freed with ferry_string_free, may be
 * NULL if not wanted) is "ready", "updating", "released", "fenced", "empty", ... Any thread. */
FERRY_API ferry_error_t* ferry_receiver_health(ferry_receiver_t* receiver, int* ready,
                                               char** state);

/* Fingerprints (docs/fingerprint.md) of every parameter, by parameter name, sorted by name.
 * *out freed with ferry_fingerprints_free. Any thread. */
FERRY_API ferry_error_t* ferry_receiver_fingerprints(ferry_receiver_t* receiver,
                                                     ferry_fingerprints_t** out);
FERRY_API size_t ferry_fingerprints_count(const ferry_fingerprints_t* fingerprints);
/* *name is owned by `fingerprints`. INVALID_ARGUMENT for an index out of range. */
FERRY_API ferry_error_t* ferry_fingerprints_entry(const ferry_fingerprints_t* fingerprints,
                                                  size_t index, const char** name,
                                                  uint64_t* value);
FERRY_API void ferry_fingerprints_free(ferry_fingerprints_t* fingerprints);

/* Stops serving and frees the receiver. Registered parameter memory is left as it is (the engine
 * owns it). NULL is a no-op. */
FERRY_API void ferry_receiver_destroy(ferry_receiver_t* receiver);

/* API 1.4: an error object made by the caller, for a callback that reports a failure to ferry
 * (ferry takes ownership of an error a callback returns). message NULL: "". Any thread. */
FERRY_API ferry_error_t* ferry_error_create(ferry_status_code_t code, const char* message);

/* SGLang's /pause_generation modes. */
typedef enum ferry_pause_mode {
  FERRY_PAUSE_ABORT = 0,    /* abort the running requests */
  FERRY_PAUSE_RETRACT = 1,  /* move them back to the waiting queue (their KV cache may go) */
  FERRY_PAUSE_IN_PLACE = 2  /* keep them where they are, KV cache included */
} ferry_pause_mode_t;

/* API 1.4: what the engine around an embedded receiver does when the control API's SGLang routes
 * ask (docs/http-api.md, "Engine routes"): /pause_generation, /continue_generation, /flush_cache,
 * the post-load processing at /end_weight_update (or after an update made outside a weight-update
 * session), and release/resume of the engine's memory tags (e.g. "kv_cache").
 *
 * Every callback is optional (NULL: the request is answered without the engine, as `ferry serve`
 * answers it). A callback returns NULL on success, or an error from ferry_error_create whose
 * message becomes the request's answer (the error is owned and freed by ferry): a failure is never
 * swallowed. Callbacks run on the control API's worker threads, one at a time, and must not call
 * ferry_receiver_* functions. user_data is passed back unchanged and must stay valid until the
 * callbacks are replaced or the receiver is destroyed; memory_tags is copied. */
typedef struct ferry_engine_callbacks {
  size_t struct_size; /* FERRY_STRUCT_SIZE(ferry_engine_callbacks_t, num_memory_tags) */
  void* user_data;
  /* *num_paused_requests (never NULL) starts at 0: how many requests were paused or aborted. */
  ferry_error_t* (*pause)(void* user_data, ferry_pause_mode_t mode,
                          uint64_t* num_paused_requests);
  ferry_error_t* (*resume)(void* user_data, int torch_empty_cache);
  ferry_error_t* (*flush_cache)(void* user_data, int torch_empty_cache);
  ferry_error_t* (*post_load)(void* user_data);
  /* release 1: release the memory of `tags` (a subset of memory_tags); 0: resume it. */
  ferry_error_t* (*memory)(void* user_data, const char* const* tags, size_t num_tags,
                           int release);
  /* The memory tags the engine owns (never "weights" or "staging", ferry's). Copied. */
  const char* const* memory_tags;
  size_t num_memory_tags;
} ferry_engine_callbacks_t;

/* API 1.4: sets (replaces) the engine callbacks; NULL removes them. FAILED_PRECONDITION while
 * generation is paused or a weight-update session is open; INVALID_ARGUMENT for a bad struct_size,
 * memory tags without a memory callback, or a store tag among them. Any thread. */
FERRY_API ferry_error_t* ferry_receiver_set_engine_callbacks(
    ferry_receiver_t* receiver, const ferry_engine_callbacks_t* callbacks);

/* ------------------------------------------------------------------------------------------ */
/* NCCL weight-update groups (SGLang's init_weights_update_group,                              */
/* update_weights_from_distributed, destroy_weights_update_group; plugins/nccl/README.md)     */
/* ------------------------------------------------------------------------------------------ */
/* A library built without NCCL has every function below; they return UNIMPLEMENTED. A machine
 * without a usable GPU gets FAILED_PRECONDITION from the create / init calls. */

typedef struct ferry_nccl_group ferry_nccl_group_t;

/* Rank 0 (the trainer) of a group. */
typedef struct ferry_nccl_group_create_args {
  size_t struct_size;
  const ferry_config_source_t* config; /* plugin_dirs etc.; NULL: the defaults */
  const char* master_address;  /* where rank 0 listens and receivers connect; NULL: "127.0.0.1" */
  uint16_t master_port;        /* 1..65535; the receivers' init names the same */
  uint32_t world_size;         /* the trainer plus every receiver rank, >= 1 */
  const char* group_name;      /* NULL: "weight_update_group" (SGLang's default) */
  int32_t device;              /* CUDA device of rank 0 */
  uint64_t bucket_bytes;       /* 0: 256 MiB; the receivers are told it in each request */
  int64_t init_timeout_ms;     /* rendezvous + communicator init; 0: 120000 */
  int64_t bucket_timeout_ms;   /* per bucket; 0: 120000 */
} ferry_nccl_group_create_args_t;

/* Creates the group as rank 0 and blocks until every rank joined (each receiver's
 * init_weights_update_group, HTTP or ferry_receiver_init_weights_update_group, must run
 * concurrently) or the init timeout passed (TIMEOUT naming the missing ranks). *out freed with
 * ferry_nccl_group_destroy. Any thread. */
FERRY_API ferry_error_t* ferry_nccl_group_create(const ferry_nccl_group_create_args_t* args,
                                                 ferry_nccl_group_t** out);

/* The request every receiver must get for one update (the JSON body of POST
 * /update_weights_from_distributed: names, dtypes, shapes, group_name, bucket_bytes, timeout_s,
 * weight_version when not NULL) for these tensors in this order. *json freed with
 * ferry_string_free. */
FERRY_API ferry_error_t* ferry_nccl_group_update_request(ferry_nccl_group_t* group,
                                                         const ferry_tensor_t* const* tensors,
                                                         size_t num_tensors,
                                                         const char* weight_version, char** json);

/* Broadcasts one update (tensors in CUDA memory of the group's device, or in host memory; read in
 * place, unchanged until the call returns) while every receiver receives the same request. On
 * failure every rank aborts; the error names the bucket, the phase and any rank that left, and the
 * group needs ferry_nccl_group_reinit. *bytes / *seconds (may be NULL) get what was broadcast.
 * One broadcast at a time per group. */
FERRY_API ferry_error_t* ferry_nccl_group_broadcast(ferry_nccl_group_t* group,
                                                    const ferry_tensor_t* const* tensors,
                                                    size_t num_tensors, uint64_t* bytes,
                                                    double* seconds);

/* Re-creates the group after a failure (the stale communicator goes first); the receivers init
 * again. Blocks like ferry_nccl_group_create. */
FERRY_API ferry_error_t* ferry_nccl_group_reinit(ferry_nccl_group_t* group);

/* Any thread: a broadcast in flight fails with ABORTED and every receiver's wait names rank 0. */
FERRY_API ferry_error_t* ferry_nccl_group_abort(ferry_nccl_group_t* group, const char* reason);

/* destroy_weights_update_group on rank 0, within timeout_ms (0: 15000): finalized when every
 * receiver destroys at the same time, aborted locally otherwise. *how (may be NULL; freed with
 * ferry_string_free): "finalized", "aborted", "continuing in the background" or "closed". */
FERRY_API ferry_error_t* ferry_nccl_group_close(ferry_nccl_group_t* group, int64_t timeout_ms,
                                                char** how);

/* Closes (if not closed) and frees the group. NULL is a no-op. */
FERRY_API void ferry_nccl_group_destroy(ferry_nccl_group_t* group);

/* An embedded receiver joining a group (SGLang's init_weights_update_group fields). */
typedef struct ferry_weights_update_group_args {
  size_t struct_size;
  const char* master_address;  /* rank 0's address */
  uint16_t master_port;
  uint32_t rank_offset;        /* >= 1: this receiver's first rank (rank 0 is the trainer) */
  uint32_t world_size;
  const char* group_name;      /* NULL: "weight_update_group" */
  const char* backend;         /* NULL or "nccl" */
  int64_t timeout_ms;          /* rendezvous + init; 0: 120000 */
} ferry_weights_update_group_args_t;

/* Joins the group on the receiver's CUDA device (fixes the parameter layout as
 * ferry_receiver_serve does). Blocks until every rank joined or the timeout passed. A group of that
 * name that failed earlier is destroyed first; a ready one is FAILED_PRECONDITION. Serialized with
 * the receiver's other group calls. */
FERRY_API ferry_error_t* ferry_receiver_init_weights_update_group(
    ferry_receiver_t* receiver, const ferry_weights_update_group_args_t* args);

/* Receives one update by broadcast and applies it as one transaction. `request_json` is the body
 * of POST /update_weights_from_distributed (what ferry_nccl_group_update_request returns). On any
 * failure the previous version stays and the group is marked failed (init it again). *version
 * (may be NULL) gets the committed version number. */
FERRY_API ferry_error_t* ferry_receiver_update_weights_from_distributed(ferry_receiver_t* receiver,
                                                                        const char* request_json,
                                                                        uint64_t* version);

/* Leaves and destroys group `group_name` (NULL: "weight_update_group") within timeout_ms (0:
 * 15000); *how as ferry_nccl_group_close's. NOT_FOUND for an unknown group. */
FERRY_API ferry_error_t* ferry_receiver_destroy_weights_update_group(ferry_receiver_t* receiver,
                                                                    const char* group_name,
                                                                    int64_t timeout_ms, char** how);

/* ------------------------------------------------------------------------------------------ */
/* checkpoint-engine (SGLang's update_weights_from_ipc; plugins/ckpt_engine/README.md)         */
/* ------------------------------------------------------------------------------------------ */

/* Receives one update from an unmodified checkpoint-engine ParameterServer (ZMQ + CUDA IPC, same
 * node) and applies it as one transaction (fixes the parameter layout as ferry_receiver_serve
 * does). `request_json` is the body of POST /update_weights_from_ipc: {"zmq_handles": {GPU UUID:
 * address}, "weight_version": ..., "flush_cache": ..., "timeout_s": ...}; the address of this
 * receiver's GPU (receiver.device cuda:N) is used. Blocks until the ParameterServer's last
 * message; on any failure the previous version stays, the ParameterServer is told the error and
 * the returned error names the phase. *version (may be NULL) gets the committed version number.
 * FAILED_PRECONDITION on a CPU receiver, UNIMPLEMENTED in a build without CUDA, NOT_FOUND when
 * the ckpt_engine transport plugin is missing (a build without ZeroMQ). */
FERRY_API ferry_error_t* ferry_receiver_update_weights_from_ipc(ferry_receiver_t* receiver,
                                                               const char* request_json,
                                                               uint64_t* version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERRY_FERRY_H_ */
