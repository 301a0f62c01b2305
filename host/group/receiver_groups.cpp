// group/receiver_groups.cpp: the receiver's weight-update groups: joining through the backend's
// broadcast transport, and one update received by broadcast: a bucket source of the update loop
// (see receiver_groups.hpp).
#include "group/receiver_groups.hpp"

#include <fmt/format.h>

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/host_api.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "ferry_build_config.h"
#include "group/group_table.hpp"
#include "registry/registry.hpp"
#include "store/store_device.hpp"
#include "update/bucket_source.hpp"

#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry::receiver {

namespace {

#if FERRY_HAVE_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(e == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "{}: {}", what, cudaGetErrorString(e));
  }
}
#endif

// Host memory aligned as buckets are (FERRY_BUCKET_ALIGNMENT), freed with std::free.
void* host_alloc(std::uint64_t bytes, const char* what) {
  const std::uint64_t rounded =
      (std::max<std::uint64_t>(bytes, 1) + FERRY_BUCKET_ALIGNMENT - 1) / FERRY_BUCKET_ALIGNMENT *
      FERRY_BUCKET_ALIGNMENT;
  void* p = std::aligned_alloc(FERRY_BUCKET_ALIGNMENT, rounded);
  if (p == nullptr) fail(FERRY_STATUS_OUT_OF_MEMORY, "{}: {} bytes of host memory", what, bytes);
  return p;
}

// Where a group's broadcasts land before the update engine applies them: two buckets (double
// buffering) registered with the group, in device memory for a transport that moves device
// memory only (nccl) and in host memory otherwise (gloo); for device buckets whose parameters
// live in host memory also a pinned host copy the engine applies from; for a flattened update
// one host buffer that the whole broadcast lands in. Grows when an update needs larger buckets.
// Freed after the group's transport is gone (close()).
struct Staging {
  bool on_device = false;
  int device = 0;
  std::uint64_t bytes = 0;
  void* buffers[2] = {nullptr, nullptr};
  ferry_memory_t* registrations[2] = {nullptr, nullptr};
  void* host = nullptr;  // device buckets, parameters not on `device`
  void* flat = nullptr;  // flattened updates
  std::uint64_t flat_bytes = 0;
  ferry_memory_t* flat_registration = nullptr;
#if FERRY_HAVE_CUDA
  cudaStream_t copy_stream = nullptr;
#endif

  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    release();
    std::free(flat);
#if FERRY_HAVE_CUDA
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
#endif
  }
  void release() noexcept {
#if FERRY_HAVE_CUDA
    if (on_device) {
      cudaSetDevice(device);
      for (auto& b : buffers) {
        if (b != nullptr) cudaFree(b);
        b = nullptr;
      }
      if (host != nullptr) cudaFreeHost(host);
      host = nullptr;
    }
#endif
    for (auto& b : buffers) {
      std::free(b);
      b = nullptr;
    }
    bytes = 0;
  }
};

}  // namespace

// One joined group of this receiver. The staging memory is freed only after the transport
// that wrote into it is gone: close() hands it to the group's teardown.
struct ReceiverGroup {
  std::shared_ptr<const registry::LoadedPlugin> plugin;  // keeps the .so loaded
  std::shared_ptr<Staging> staging = std::make_shared<Staging>();
  std::unique_ptr<nccl::BroadcastGroup> group;
  bool apply_from_device = false;  // the parameters live on the group's CUDA device

  ~ReceiverGroup() { close(nccl::Clock::now() + nccl::kDefaultCloseTimeout, false); }
  void abort(const std::string& reason) noexcept {
    if (group) group->abort(reason);
  }
  nccl::BroadcastGroup::CloseOutcome close(nccl::Clock::time_point deadline, bool healthy) {
    if (!group) return nccl::BroadcastGroup::CloseOutcome::aborted;
    // The teardown thread frees the staging and drops the plugin reference after the
    // transport, whenever it finishes.
    auto outcome = group->close(deadline, healthy,
                                [staging = std::move(staging), plugin = plugin]() mutable {
                                  staging.reset();
                                  plugin.reset();
                                });
    group.reset();
    return outcome;
  }

  // The buckets go to device memory when the transport cannot move host memory.
  bool device_buckets() const {
    return (group->caps().memory_kinds & (FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED)) == 0;
  }

  void ensure_staging(std::uint64_t bytes) {
    Staging& st = *staging;
    if (st.bytes >= bytes) return;
    // Old registrations stay with the group until it is destroyed; they are never used again.
    st.release();
    st.on_device = device_buckets();
    if (!st.on_device) {
      for (int i = 0; i < 2; ++i) {
        st.buffers[i] = host_alloc(bytes, "bucket staging");
        st.registrations[i] = group->register_host(st.buffers[i], bytes);
      }
      st.bytes = bytes;
      return;
    }
#if FERRY_HAVE_CUDA
    st.device = group->init().device;
    check_cuda(cudaSetDevice(st.device), "cudaSetDevice");
    if (st.copy_stream == nullptr && !apply_from_device) {
      check_cuda(cudaStreamCreateWithFlags(&st.copy_stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
    }
    for (int i = 0; i < 2; ++i) {
      check_cuda(cudaMalloc(&st.buffers[i], bytes), "device staging (cudaMalloc)");
      st.registrations[i] = group->register_device(st.buffers[i], bytes);
    }
    if (!apply_from_device) {
      check_cuda(cudaHostAlloc(&st.host, bytes, cudaHostAllocDefault),
                 "pinned staging (cudaHostAlloc)");
    }
    st.bytes = bytes;
#else
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "weight-update group '{}': its transport moves device memory only and this ferry was "
         "built without CUDA",
         group->init().group_name);
#endif
  }

  void ensure_flat(std::uint64_t bytes) {
    Staging& st = *staging;
    if (st.flat != nullptr && st.flat_bytes >= bytes) return;
    std::free(st.flat);  // its old registration is never used again
    st.flat = nullptr;
    st.flat = host_alloc(bytes, "flattened bucket");
    st.flat_bytes = bytes;
    st.flat_registration = group->register_host(st.flat, bytes);
  }
};

namespace {

// What each bucket's broadcasts are: ferry's rank 0 sends a bucket in one broadcast; a torch
// trainer sends each tensor in its own, which lands at the tensor's place in the bucket.
struct Piece {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

std::vector<std::vector<Piece>> bucket_pieces(const std::vector<manifest::Manifest>& buckets,
                                              bool per_tensor) {
  std::vector<std::vector<Piece>> pieces(buckets.size());
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    if (!per_tensor) {
      pieces[k].push_back({0, buckets[k].bucket_bytes});
      continue;
    }
    for (const auto& t : buckets[k].tensors) pieces[k].push_back({t.offset, t.size});
  }
  return pieces;
}

// The buckets of one broadcast update as the update loop takes them. Two buckets in flight, as
// rank 0 sends them: bucket k+1's broadcasts go into the other buffer (applied at k-1, free)
// before bucket k is waited for, and arrive while k is applied; so the loop applies one bucket
// at a time (not double buffered: the engine returns from a bucket once its scatter finished,
// and then the buffer may receive bucket k+2).
class BroadcastBuckets final : public update::BucketSource {
 public:
  using Pendings = std::vector<nccl::BroadcastGroup::Pending>;

  BroadcastBuckets(ReceiverGroup& entry, const std::vector<manifest::Manifest>& buckets,
                   std::vector<std::vector<Piece>> pieces, std::chrono::milliseconds timeout,
                   Pendings (&pending)[2], std::string& phase)
      : entry_(entry),
        buckets_(buckets),
        pieces_(std::move(pieces)),
        timeout_(timeout),
        pending_(pending),
        phase_(phase) {}

  void begun() override {
    phase_ = "allocate staging";
    entry_.ensure_staging(nccl::largest_bucket(buckets_));
    if (buckets_.empty()) return;
    phase_ = "receive bucket 0";
    issue(0, 0);
  }

  bool next(std::uint32_t, update::Bucket& out) override {
    const auto count = static_cast<std::uint32_t>(buckets_.size());
    const std::uint32_t k = next_;
    if (k == count) return false;
    nccl::BroadcastGroup& group = *entry_.group;
    Staging& st = *entry_.staging;
    const int slot = static_cast<int>(k % 2);
    if (k + 1 < count) {
      phase_ = fmt::format("receive bucket {}", k + 1);
      issue(k + 1, 1 - slot);
    }
    phase_ = fmt::format("receive bucket {}", k);
    for (auto& p : pending_[slot]) group.wait(p);
    pending_[slot].clear();
    phase_ = fmt::format("apply bucket {}", k);
    const std::uint64_t bytes = buckets_[k].bucket_bytes;
    out.manifest = buckets_[k];
    out.index = k;
    out.slot = static_cast<std::uint32_t>(slot);
    out.data = {static_cast<const std::byte*>(st.buffers[slot]), bytes};
    out.kind = FERRY_MEMORY_HOST;
    if (st.on_device && entry_.apply_from_device) {
      // The parameters live on this device: scattered straight from the received bucket.
      out.kind = FERRY_MEMORY_CUDA;
    } else if (st.on_device) {
#if FERRY_HAVE_CUDA
      check_cuda(cudaMemcpyAsync(st.host, st.buffers[slot], bytes, cudaMemcpyDeviceToHost,
                                 st.copy_stream),
                 "copy a bucket off the device");
      check_cuda(cudaStreamSynchronize(st.copy_stream), "copy a bucket off the device");
      out.data = {static_cast<const std::byte*>(st.host), bytes};
#endif
    }
    ++next_;
    return true;
  }

 private:
  void issue(std::uint32_t k, int slot) {
    Staging& st = *entry_.staging;
    for (const Piece& piece : pieces_[k]) {
      pending_[slot].push_back(entry_.group->issue(st.registrations[slot], piece.offset,
                                                   piece.bytes, k, timeout_));
    }
  }

  ReceiverGroup& entry_;
  const std::vector<manifest::Manifest>& buckets_;
  std::vector<std::vector<Piece>> pieces_;
  std::chrono::milliseconds timeout_;
  Pendings (&pending_)[2];
  std::string& phase_;
  std::uint32_t next_ = 0;
};

// A flattened update (SGLang's FlattenedTensorBucket): one broadcast of every tensor's bytes back
// to back, received whole, then copied bucket by bucket into the aligned layout the engine
// applies.
class FlattenedBuckets final : public update::BucketSource {
 public:
  FlattenedBuckets(ReceiverGroup& entry, const std::vector<manifest::Manifest>& buckets,
                   const std::vector<nccl::TensorSpec>& tensors, std::chrono::milliseconds timeout,
                   BroadcastBuckets::Pendings& pending, std::string& phase)
      : entry_(entry),
        buckets_(buckets),
        tensors_(tensors),
        timeout_(timeout),
        pending_(pending),
        phase_(phase) {}

  void begun() override {
    phase_ = "allocate staging";
    std::uint64_t total = 0;
    for (const auto& t : tensors_) total += t.bytes;
    entry_.ensure_staging(nccl::largest_bucket(buckets_));
    entry_.ensure_flat(total);
    phase_ = "receive the flattened bucket";
    Staging& st = *entry_.staging;
    pending_.push_back(entry_.group->issue(st.flat_registration, 0, total, 0, timeout_));
    for (auto& p : pending_) entry_.group->wait(p);
    pending_.clear();
  }

  bool next(std::uint32_t, update::Bucket& out) override {
    const std::uint32_t k = next_;
    if (k == buckets_.size()) return false;
    phase_ = fmt::format("apply bucket {}", k);
    Staging& st = *entry_.staging;
    auto* dst = static_cast<std::byte*>(st.buffers[0]);
    const auto* src = static_cast<const std::byte*>(st.flat);
    for (const auto& t : buckets_[k].tensors) {
      std::memcpy(dst + t.offset, src + source_offset_, t.size);
      source_offset_ += t.size;
    }
    out.manifest = buckets_[k];
    out.index = k;
    out.slot = 0;
    out.data = {dst, buckets_[k].bucket_bytes};
    out.kind = FERRY_MEMORY_HOST;
    ++next_;
    return true;
  }

 private:
  ReceiverGroup& entry_;
  const std::vector<manifest::Manifest>& buckets_;
  const std::vector<nccl::TensorSpec>& tensors_;
  std::chrono::milliseconds timeout_;
  BroadcastBuckets::Pendings& pending_;
  std::string& phase_;
  std::uint32_t next_ = 0;
  std::uint64_t source_offset_ = 0;
};

}  // namespace

struct WeightUpdateGroups::Impl {
  Receiver& receiver;
  std::timed_mutex mutex;  // serializes init / update / destroy
  nccl::GroupTable<ReceiverGroup> groups;

  explicit Impl(Receiver& r) : receiver(r) {}
};

WeightUpdateGroups::WeightUpdateGroups(Receiver& receiver)
    : impl_(std::make_unique<Impl>(receiver)) {}

WeightUpdateGroups::~WeightUpdateGroups() = default;

void WeightUpdateGroups::init(nccl::GroupInit init) {
  auto& s = *impl_;
  std::lock_guard lock(s.mutex);
  const auto& config = s.receiver.receiver_config();
  init.rank = init.rank_offset + config.receiver.tp_rank;
  const auto device = store::parse_store_device(config.receiver.device);
  const bool gloo = init.backend == "gloo";
  init.device = gloo ? -1 : (device.cuda ? device.ordinal : 0);
  nccl::check_group_init(init);
  if (!gloo && !FERRY_HAVE_NCCL) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "init_weights_update_group: this ferry was built without NCCL (-Dnccl, needs CUDA); "
         "backend 'gloo' joins a torch trainer's CPU group");
  }
  const std::string& transport = gloo ? config.update.gloo_transport : config.update.group_transport;
  std::shared_ptr<const registry::LoadedPlugin> plugin;
  try {
    plugin = s.receiver.plugin_registry().transport(transport);
  } catch (const Error& e) {
    if (e.code() != FERRY_STATUS_NOT_FOUND || !gloo) throw;
    throw Error(FERRY_STATUS_UNIMPLEMENTED,
                fmt::format("init_weights_update_group: backend 'gloo' needs the transport "
                            "plugin '{}' (built with the libtorch feature: apt-get install "
                            "libtorch-dev libgloo-dev): {}",
                            transport, e.what()));
  }
  logger("receiver")->info("joining weight-update group '{}' ({}, {}) as rank {}/{} (rank 0 at "
                           "{}:{})",
                           init.group_name, init.backend, transport, init.rank, init.world_size,
                           init.master_address, init.master_port);
  s.groups.init(init.group_name, [&] {
    auto entry = std::make_unique<ReceiverGroup>();
    entry->plugin = plugin;
    entry->apply_from_device = device.cuda && !gloo;
    entry->group = std::make_unique<nccl::BroadcastGroup>(plugin->transport(), host_api_table(),
                                                          init);
    return entry;
  });
}

UpdateReport WeightUpdateGroups::update(const DistributedUpdate& request) {
  auto& s = *impl_;
  std::lock_guard lock(s.mutex);
  ReceiverGroup& entry = s.groups.ready(request.group_name);
  nccl::BroadcastGroup& group = *entry.group;
  const bool torch_rank0 = group.own_rendezvous();
  if (request.flattened && !torch_rank0) {
    // ferry's rank 0 broadcasts its bucket layout: a flattened read would misplace every byte.
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "update_weights_from_distributed: load_format 'flattened_bucket' is for a group a torch "
         "trainer created (backend 'gloo'); group '{}' has ferry's rank 0, which broadcasts its "
         "bucketed layout (leave load_format out)",
         request.group_name);
  }
  // Version 0 in the manifests: the engine checks only non-zero versions against the active one.
  const auto buckets = nccl::plan_buckets(request.tensors, request.bucket_bytes, 0);
  for (const auto& b : buckets) manifest::validate(b);

  std::vector<ferry_tensor_desc_t> catalog;
  catalog.reserve(request.tensors.size());
  for (const auto& t : request.tensors) {
    catalog.push_back(manifest::tensor_desc(t.name, t.dtype, t.shape));
  }

  std::unique_ptr<Receiver::StreamingUpdate> update;
  BroadcastBuckets::Pendings pending[2];
  std::string phase = "open the update";
  try {
    update = s.receiver.open_session(catalog, "");
    UpdateReport report;
    if (request.flattened) {
      FlattenedBuckets source(entry, buckets, request.tensors, request.bucket_timeout, pending[0],
                              phase);
      report = update->run(source, s.receiver.version().number + 1, request.weight_version,
                           &phase);
    } else {
      BroadcastBuckets source(entry, buckets, bucket_pieces(buckets, torch_rank0),
                              request.bucket_timeout, pending, phase);
      report = update->run(source, s.receiver.version().number + 1, request.weight_version,
                           &phase);
    }
    report.tensors = request.tensors.size();
    logger("receiver")->info(
        "update {} ('{}') by broadcast in group '{}'{}: {} buckets in {:.3f} s",
        report.version.number, report.version.label, request.group_name,
        request.flattened ? " (flattened)" : (torch_rank0 ? " (one broadcast per tensor)" : ""),
        report.buckets, report.seconds);
    return report;
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    const ferry_status_code_t code = error != nullptr ? error->code() : FERRY_STATUS_INTERNAL;
    // The broadcast stream is out of step with rank 0 now: abort the group so rank 0 learns it
    // (its wait names this rank) and the next update starts from a fresh init.
    const std::string reason =
        fmt::format("group '{}' update failed during phase '{}': {}", request.group_name, phase,
                    e.what());
    for (auto& slot : pending) {
      for (auto& p : slot) group.discard(p);
    }
    s.groups.mark_failed(request.group_name, reason);
    logger("receiver")->warn("{}", reason);
    throw Error(code, reason);
  }
}

std::string WeightUpdateGroups::destroy(const std::string& group_name,
                                        std::chrono::milliseconds timeout) {
  auto& s = *impl_;
  const auto deadline = nccl::Clock::now() + timeout;
  std::unique_lock lock(s.mutex, std::defer_lock);
  if (!lock.try_lock_until(deadline)) {
    fail(FERRY_STATUS_TIMEOUT,
         "destroy of weight-update group '{}': an update of this receiver still runs after {} ms "
         "(it ends at its bucket deadline; retry then)",
         group_name, timeout.count());
  }
  auto [entry, state] = s.groups.take(group_name);
  const auto outcome = entry->close(deadline, state == nccl::GroupState::ready);
  entry.reset();
  const char* how = nccl::close_outcome_name(outcome);
  logger("receiver")->info("weight-update group '{}' destroyed ({})", group_name, how);
  return how;
}

}  // namespace ferry::receiver
