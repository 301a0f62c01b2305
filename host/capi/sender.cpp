// capi/sender.cpp: ferry_sender_* over session::Sender: the trainer side of the C API.
#include <ferry/ferry.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "capi/capi_boundary.hpp"
#include "capi/config_source.hpp"
#include "capi/push_report.hpp"
#include "capi/tensor_input.hpp"
#include "order/stream_order.hpp"
#include "session/sender/push_progress.hpp"
#include "session/sender/sender.hpp"

namespace {

// The plain views of the last push, as the caller described them, and the checked views made of
// them. An RL trainer pushes the same tensors every step, through the same descriptions (the
// Python Sender reuses its ferry_tensor_t array while the tensors are unchanged): comparing each
// description's bytes with the last (~0.05 us a tensor) stands in for reading and checking it
// again (~0.7 us: its name and shape copied, the names hashed for duplicates).
struct LastPush {
  std::vector<ferry_tensor_t> raw;                 // each as given (struct_size as given)
  std::vector<std::vector<std::int64_t>> shapes;   // *shape, *strides as given
  std::vector<std::vector<std::int64_t>> strides;  // empty: strides was NULL
  std::vector<ferry::session::TensorView> views;

  void clear() {
    raw.clear();
    shapes.clear();
    strides.clear();
    views.clear();
  }

  // Whether `tensors` describe, byte for byte, what the last push's did (names' and shapes'
  // contents included: a caller may reuse its buffers for other values).
  bool same(const ferry_tensor_t* const* tensors, std::size_t count) const {
    if (raw.empty() || count != raw.size()) return false;
    for (std::size_t i = 0; i < count; ++i) {
      const ferry_tensor_t* t = tensors[i];
      const ferry_tensor_t& was = raw[i];
      if (t == nullptr || t->struct_size != was.struct_size) return false;
      const std::size_t size = std::min(t->struct_size, sizeof(ferry_tensor_t));
      if (std::memcmp(t, &was, size) != 0 || was.dlpack != nullptr) return false;
      if (std::strcmp(t->name, views[i].name.c_str()) != 0) return false;
      const std::size_t dims = was.ndim * sizeof(std::int64_t);
      if (dims > 0 && std::memcmp(was.shape, shapes[i].data(), dims) != 0) return false;
      if (was.strides != nullptr && dims > 0 &&
          std::memcmp(was.strides, strides[i].data(), dims) != 0) {
        return false;
      }
    }
    return true;
  }

  // Whether every one of `tensors` (checked) is a plain view: DLPack capsules are made anew for
  // each push, never worth remembering.
  static bool all_plain(const ferry_tensor_t* const* tensors, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      if (tensors[i]->dlpack != nullptr) return false;
    }
    return true;
  }

  // Remembers `tensors` (checked plain views) as described by `checked`.
  void remember(const ferry_tensor_t* const* tensors, std::size_t count,
                std::vector<ferry::session::TensorView> checked) {
    clear();
    raw.resize(count);
    shapes.resize(count);
    strides.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      const ferry_tensor_t* t = tensors[i];
      std::memset(&raw[i], 0, sizeof(ferry_tensor_t));
      std::memcpy(&raw[i], t, std::min(t->struct_size, sizeof(ferry_tensor_t)));
      const std::uint32_t ndim = t->ndim;
      if (ndim > 0) shapes[i].assign(t->shape, t->shape + ndim);
      if (ndim > 0 && t->strides != nullptr) strides[i].assign(t->strides, t->strides + ndim);
    }
    views = std::move(checked);
  }
};

}  // namespace

// Owns everything session::Sender borrows (config, registry), declared in that order so the
// sender is destroyed first.
struct ferry_sender {
  ferry::config::Config config;
  std::unique_ptr<ferry::registry::Registry> registry;
  std::unique_ptr<ferry::session::Sender> sender;
  // Held by the push that uses `last` (another push at the same time reads its tensors itself,
  // and the session refuses it).
  std::mutex last_mutex;
  LastPush last;
};

namespace {

ferry_push_report_t* new_report(const std::vector<ferry::session::ReceiverResult>& results) {
  auto report = std::make_unique<ferry_push_report_t>();
  for (const auto& r : results) {
    report->receivers.push_back({r.address, r.committed, r.error, r.bytes, r.buckets, r.seconds,
                                 r.transport, r.direct, r.writer_fingerprints, r.reused_session,
                                 r.rank_bytes, r.needed_bytes, r.reads_in_place});
  }
  return report.release();
}

std::chrono::milliseconds timeout_or(std::int64_t ms, std::chrono::milliseconds fallback,
                                     const char* function, const char* what) {
  if (ms < 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} is {} ms; it must be >= 0 (0: default)",
                function, what, ms);
  }
  return ms == 0 ? fallback : std::chrono::milliseconds(ms);
}

// One push (sharded when `shard` is given) from the C API's arguments.
void push_views(ferry_sender_t* sender, const ferry_push_args_t* args,
                const ferry_sharded_push_args_t* shard, ferry_push_report_t** report,
                const char* kFn) {
  const auto a = ferry::capi::read_struct(
      args, FERRY_STRUCT_SIZE(ferry_push_args_t, label), kFn, "args");
  if (a.num_tensors == 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: no tensors (num_tensors is 0)", kFn);
  }
  // A whole push of the same plain views as the last one reuses what was read of them.
  std::unique_lock<std::mutex> cached(sender->last_mutex, std::defer_lock);
  const bool cacheable = shard == nullptr && cached.try_lock();
  const bool same =
      cacheable && a.tensors != nullptr && sender->last.same(a.tensors, a.num_tensors);
  std::vector<ferry::session::TensorView> views;
  bool from_last = same;
  if (!same) {
    if (cacheable) sender->last.clear();
    auto inputs = ferry::capi::read_tensors(a.tensors, a.num_tensors, kFn);
    views.reserve(inputs.size());
    for (auto& in : inputs) {
      views.push_back(
          {std::move(in.name), in.dtype, std::move(in.shape), in.data, in.memory_kind, in.device});
    }
    if (cacheable && LastPush::all_plain(a.tensors, a.num_tensors)) {
      sender->last.remember(a.tensors, a.num_tensors, std::move(views));
      views.clear();
      from_last = true;
    }
  }
  const std::span<const ferry::session::TensorView> pushed_views =
      from_last ? std::span<const ferry::session::TensorView>(sender->last.views)
                : std::span<const ferry::session::TensorView>(views);
  std::optional<ferry::session::ShardSpec> spec;
  if (shard != nullptr) {
    if (shard->world == 0 || shard->rank >= shard->world) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: rank {} of a world of {} senders", kFn,
                  shard->rank, shard->world);
    }
    spec = ferry::session::ShardSpec{shard->rank, shard->world};
    for (std::size_t k = 0; shard->blocks != nullptr && k < views.size(); ++k) {
      const ferry_block_t* given = shard->blocks[k];
      if (given == nullptr) continue;
      const auto block = ferry::capi::read_struct(
          given, FERRY_STRUCT_SIZE(ferry_block_t, replica), kFn, "args->blocks[k]");
      auto& v = views[k];
      const std::size_t ndim = v.shape.size();
      if (ndim > 0 && (block.global_shape == nullptr || block.offsets == nullptr)) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "{}: tensor {} '{}': its block needs global_shape and offsets ({} each)", kFn,
                    k, v.name, ndim);
      }
      v.global_shape.assign(block.global_shape, block.global_shape + ndim);
      v.offsets.assign(block.offsets, block.offsets + ndim);
      v.replica = block.replica != 0;
    }
  }
  std::optional<std::string> label;
  if (a.label != nullptr) label = a.label;
  // Fields past the caller's struct_size read as zero: FERRY_ORDER_SYNC_DEVICES, no handles.
  const ferry::order::StreamOrder producers = ferry::order::checked_order(
      a.order, a.order_handles, a.num_order_handles, "ferry_sender_push: args->order");
  const ferry::session::PushReport pushed =
      sender->sender->push(pushed_views, a.version, label, producers, spec);
  if (report != nullptr) {
    ferry_push_report_t* r = new_report(pushed.receivers);
    r->version = pushed.version;
    r->bytes = pushed.bytes;
    r->seconds = pushed.seconds;
    r->producer_wait_seconds = pushed.producer_wait_seconds;
    *report = r;
  }
}

}  // namespace

extern "C" {

FERRY_API ferry_error_t* ferry_sender_create(const ferry_sender_create_args_t* args,
                                             ferry_sender_t** out) {
  static constexpr const char* kFn = "ferry_sender_create";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(out, kFn, "out");
    *out = nullptr;
    const auto a = ferry::capi::read_struct(
        args, FERRY_STRUCT_SIZE(ferry_sender_create_args_t, commit_timeout_ms), kFn, "args");
    if (a.num_receivers == 0) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: no receivers (num_receivers is 0)", kFn);
    }
    ferry::capi::require(a.receivers, kFn, "args->receivers");
    auto handle = std::make_unique<ferry_sender_t>();
    handle->config = ferry::capi::load_config(a.config, kFn);
    ferry::session::SenderOptions options;
    for (std::size_t i = 0; i < a.num_receivers; ++i) {
      if (a.receivers[i] == nullptr || a.receivers[i][0] == '\0') {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: receiver {} has no address (HOST:PORT)",
                    kFn, i);
      }
      options.receivers.emplace_back(a.receivers[i]);
    }
    if (a.transport != nullptr && a.transport[0] != '\0') options.transport = a.transport;
    options.bucket_bytes =
        a.bucket_bytes != 0 ? a.bucket_bytes : handle->config.update.bucket_bytes;
    options.token = a.token != nullptr ? a.token : handle->config.receiver.token;
    options.connect_timeout = timeout_or(a.connect_timeout_ms, options.connect_timeout, kFn,
                                         "connect_timeout_ms");
    options.bucket_timeout = timeout_or(
        a.bucket_timeout_ms,
        std::chrono::milliseconds(handle->config.update.bucket_timeout_ms), kFn,
        "bucket_timeout_ms");
    options.commit_timeout = timeout_or(
        a.commit_timeout_ms,
        std::chrono::milliseconds(handle->config.update.commit_timeout_ms), kFn,
        "commit_timeout_ms");
    // Progress on stderr as the config's `progress` says (Python's Sender sets it; its default
    // draws on a terminal only).
    options.progress = ferry::session::progress_display(
        handle->config.progress, std::chrono::milliseconds(handle->config.progress_interval_ms));
    handle->registry = ferry::capi::make_registry(handle->config);
    handle->sender = std::make_unique<ferry::session::Sender>(handle->config, *handle->registry,
                                                              std::move(options));
    *out = handle.release();
  });
}

FERRY_API ferry_error_t* ferry_sender_push(ferry_sender_t* sender, const ferry_push_args_t* args,
                                           ferry_push_report_t** report) {
  static constexpr const char* kFn = "ferry_sender_push";
  return ferry::capi::guard(kFn, [&] {
    if (report != nullptr) *report = nullptr;
    ferry::capi::require(sender, kFn, "sender");
    push_views(sender, args, nullptr, report, kFn);
  });
}

FERRY_API ferry_error_t* ferry_sender_push_sharded(ferry_sender_t* sender,
                                                   const ferry_sharded_push_args_t* args,
                                                   ferry_push_report_t** report) {
  static constexpr const char* kFn = "ferry_sender_push_sharded";
  return ferry::capi::guard(kFn, [&] {
    if (report != nullptr) *report = nullptr;
    ferry::capi::require(sender, kFn, "sender");
    const auto a = ferry::capi::read_struct(
        args, FERRY_STRUCT_SIZE(ferry_sharded_push_args_t, blocks), kFn, "args");
    ferry::capi::require(a.push, kFn, "args->push");
    push_views(sender, a.push, &a, report, kFn);
  });
}

FERRY_API ferry_error_t* ferry_sender_status(ferry_sender_t* sender,
                                             ferry_push_report_t** report) {
  static constexpr const char* kFn = "ferry_sender_status";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(report, kFn, "report");
    *report = nullptr;
    ferry::capi::require(sender, kFn, "sender");
    *report = new_report(sender->sender->status());
  });
}

FERRY_API ferry_error_t* ferry_sender_abort(ferry_sender_t* sender, const char* reason) {
  static constexpr const char* kFn = "ferry_sender_abort";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(sender, kFn, "sender");
    sender->sender->abort(reason != nullptr ? reason : "aborted through ferry_sender_abort");
  });
}

FERRY_API void ferry_sender_destroy(ferry_sender_t* sender) { delete sender; }

}  // extern "C"
