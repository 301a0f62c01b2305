// ckpt_engine/ckpt_engine_transport.cpp: the checkpoint-engine transport's options, sources and
// reads (see ckpt_engine/ckpt_engine_transport.hpp).
#include "ckpt_engine/ckpt_engine_transport.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <charconv>
#include <chrono>
#include <string_view>

#include "ckpt_engine/cuda_buffer.hpp"

using ferry::fail;

namespace {

double parse_seconds(std::string_view key, std::string_view value) {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !(v > 0) || v > 86400) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ckpt_engine transport option '{}' = '{}': must be seconds in (0, 86400]", key, value);
  }
  return v;
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args) {
  if (args.role != FERRY_ROLE_RECEIVER) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "ckpt_engine: only the receiver (worker) side exists; the sender is checkpoint-engine's "
         "own ParameterServer");
  }
  device = args.device < 0 ? 0 : args.device;
  for (size_t i = 0; i < args.num_options; ++i) {
    const std::string_view key = args.options[i].key ? args.options[i].key : "";
    const std::string_view value = args.options[i].value ? args.options[i].value : "";
    if (key == "receive_timeout_s") {
      options.receive_timeout = to_ms(parse_seconds(key, value));
    } else if (key == "abort_grace_s") {
      options.abort_grace = to_ms(parse_seconds(key, value));
    } else if (key == "release_before_finish") {
      if (value != "true" && value != "false") {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "ckpt_engine transport option 'release_before_finish' = '{}': must be true or false",
             value);
      }
      options.session.release_before_finish = value == "true";
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "ckpt_engine transport: unknown option '{}' (known: receive_timeout_s, "
           "abort_grace_s, release_before_finish)",
           key);
    }
  }
}

void ferry_transport::abort(const char* reason) noexcept {
  try {
    std::lock_guard lock(mutex);
    abort_reason = reason != nullptr && *reason ? reason : "aborted by the host";
    for (auto* source : sources) source->worker->abandon(abort_reason);
  } catch (...) {
    // abort() must not throw; an allocation failure leaves the worker's deadline to end it.
  }
}

std::unique_ptr<ferry_source> ferry_transport::source_open(const char* uri) {
  if (*uri == '\0') {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "ckpt_engine source_open: needs the ParameterServer's ZMQ address as the URI");
  }
  auto source = std::make_unique<ferry_source>();
  source->transport = this;
  source->worker = std::make_unique<ferry::ckpt_engine::ZmqWorker>(
      uri, ferry::ckpt_engine::make_cuda_ipc_opener(device), options);
  std::lock_guard lock(mutex);
  if (!abort_reason.empty()) source->worker->abandon(abort_reason);
  sources.insert(source.get());
  source->opened = true;
  return source;
}

ferry_source::~ferry_source() {
  if (!opened) return;
  {
    std::lock_guard lock(transport->mutex);
    transport->sources.erase(this);
  }
  try {
    worker->conclude();
  } catch (...) {
    // The sender is gone; nothing is owed to anyone.
  }
}

std::vector<std::uint8_t> ferry_source::catalog() {
  ferry::manifest::Manifest catalog;
  catalog.bucket_bytes = worker->open_buffer(0);
  return ferry::manifest::encode(catalog);
}

ferry::sdk::SourceBucket ferry_source::read(const ferry_source_read_args_t& args) {
  auto bucket = worker->next_bucket(args.dst, args.dst_capacity, args.deadline_ns);
  if (!bucket) {
    fail(FERRY_STATUS_END_OF_STREAM, "checkpoint-engine update at {}: the sender finished",
         worker->address());
  }
  return {std::move(bucket->manifest), bucket->bytes};
}
