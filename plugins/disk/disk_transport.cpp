// disk/disk_transport.cpp: the disk transport's options, sources and reads (see
// disk/disk_transport.hpp).
#include "disk/disk_transport.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <charconv>
#include <ctime>
#include <string_view>
#include <thread>

using ferry::fail;
using ferry::disk::kMaxReadThreads;

namespace {

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

unsigned parse_read_threads(std::string_view value) {
  unsigned n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 1 || n > kMaxReadThreads) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "disk transport option 'read_threads' = '{}': must be an integer from 1 to {}", value,
         kMaxReadThreads);
  }
  return n;
}

unsigned default_read_threads() {
  return std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
}

}  // namespace

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args)
    : read_threads(default_read_threads()) {
  for (size_t i = 0; i < args.num_options; ++i) {
    const ferry_option_t& option = args.options[i];
    const std::string_view key = option.key ? option.key : "";
    const std::string_view value = option.value ? option.value : "";
    if (key == "read_threads") {
      read_threads = parse_read_threads(value);
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "disk transport: unknown option '{}' (known: read_threads)", key);
    }
  }
}

void ferry_transport::abort(const char* reason) noexcept {
  try {
    std::lock_guard lock(reason_mutex);
    abort_reason = reason ? reason : "";
  } catch (...) {
    // Keep the previous reason; the flag below is what stops the readers.
  }
  aborted.store(true);
}

std::unique_ptr<ferry_source> ferry_transport::source_open(const char* uri) {
  auto source = std::make_unique<ferry_source>();
  source->transport = this;
  source->uri = uri;
  source->source = std::make_unique<ferry::disk::DiskSource>(source->uri);
  const auto& ckpt = source->source->checkpoint();
  ferry::sdk::log(FERRY_LOG_INFO, "disk",
                  fmt::format("opened {}: {} tensors, {} bytes in {} files", source->uri,
                              ckpt.tensor_count(), ckpt.total_bytes(), ckpt.files.size()));
  return source;
}

std::vector<std::uint8_t> ferry_source::catalog() {
  return ferry::manifest::encode(source->catalog());
}

ferry::sdk::SourceBucket ferry_source::read(const ferry_source_read_args_t& args) {
  const unsigned threads = args.num_threads == 0
                               ? transport->read_threads
                               : std::min<unsigned>(args.num_threads, kMaxReadThreads);
  const std::int64_t deadline = args.deadline_ns;
  ferry_transport* owner = transport;
  auto interrupt = [owner, deadline, this] {
    if (owner->aborted.load()) {
      std::lock_guard lock(owner->reason_mutex);
      fail(FERRY_STATUS_ABORTED, "{}: read aborted: {}", uri, owner->abort_reason);
    }
    // A deadline of 0 (or less) means none.
    if (deadline > 0 && monotonic_ns() > deadline) {
      fail(FERRY_STATUS_TIMEOUT, "{}: reading a bucket passed its deadline", uri);
    }
  };
  interrupt();
  auto bucket =
      source->read({static_cast<std::uint8_t*>(args.dst), static_cast<size_t>(args.dst_capacity)},
                   threads, interrupt);
  if (!bucket) {
    fail(FERRY_STATUS_END_OF_STREAM, "{}: no more buckets", uri);
  }
  return {ferry::manifest::encode(bucket->manifest), bucket->bytes_written};
}
