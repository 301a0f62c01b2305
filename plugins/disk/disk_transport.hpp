// disk/disk_transport.hpp: one instance of the disk transport (its options and the abort flag
// its sources watch) and an open checkpoint as a source of buckets: the objects behind the
// opaque handles, with the methods of the SDK's source group (ferry/sdk/transport_plugin.hpp).
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "disk/disk_source.hpp"

namespace ferry::disk {
// The largest read_threads (option) and num_threads (per read) honoured.
inline constexpr unsigned kMaxReadThreads = 256;
}  // namespace ferry::disk

struct ferry_transport {
  // Parses the options ([transport.disk]: read_threads); INVALID_ARGUMENT naming a bad one.
  explicit ferry_transport(const ferry_transport_create_args_t& args);

  // Reads and validates the checkpoint at `uri` (DiskSource) and logs what it holds.
  std::unique_ptr<ferry_source> source_open(const char* uri);
  // Any thread: the sources' readers stop at their next chunk with ABORTED and `reason`.
  void abort(const char* reason) noexcept;

  unsigned read_threads = 8;
  std::atomic<bool> aborted{false};
  std::mutex reason_mutex;
  std::string abort_reason;  // guarded by reason_mutex
};

// An open checkpoint. Belongs to the transport that opened it; closed before it is destroyed.
struct ferry_source {
  // The catalog: every tensor, as a tensor_meta.capnp Manifest.
  std::vector<std::uint8_t> catalog();
  // The next bucket into args.dst with up to args.num_threads readers (0: read_threads), by
  // args.deadline_ns (0: none); END_OF_STREAM when nothing is left.
  ferry::sdk::SourceBucket read(const ferry_source_read_args_t& args);

  ferry_transport* transport = nullptr;
  std::string uri;
  std::unique_ptr<ferry::disk::DiskSource> source;
};
