// group/receiver_groups.cpp: the receiver's NCCL weight-update groups: joining through the nccl
// transport, and one update received by broadcast: a bucket source of the
// update loop (see receiver_groups.hpp).
#include "group/receiver_groups.hpp"

#include <fmt/format.h>

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <mutex>

#include "common/host_api.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "ferry_build_config.h"
#include "group/group_table.hpp"
#include "registry/registry.hpp"
#include "store/store_device.hpp"
#include "update/bucket_source.hpp"

#if FERRY_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ferry::receiver {
#if FERRY_HAVE_NCCL

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(e == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "{}: {}", what, cudaGetErrorString(e));
  }
}

// Two device buckets (double buffering) registered with the group, and, for a receiver whose
// parameters live in host memory, a pinned host copy the update engine applies from. Grows when
// an update needs larger buckets. Freed after the group's communicator is gone (close()).
struct Staging {
  int device = 0;
  std::uint64_t bytes = 0;
  void* device_buffers[2] = {nullptr, nullptr};
  ferry_memory_t* registrations[2] = {nullptr, nullptr};
  void* host = nullptr;  // only when the parameters are not on `device`
  cudaStream_t copy_stream = nullptr;

  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    release();
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
  }
  void release() noexcept {
    cudaSetDevice(device);
    for (auto& b : device_buffers) {
      if (b != nullptr) cudaFree(b);
      b = nullptr;
    }
    if (host != nullptr) cudaFreeHost(host);
    host = nullptr;
    bytes = 0;
  }
};

}  // namespace

// One joined group of this receiver. The staging memory is freed only after the communicator
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
    // communicator, whenever it finishes.
    auto outcome = group->close(deadline, healthy,
                                [staging = std::move(staging), plugin = plugin]() mutable {
                                  staging.reset();
                                  plugin.reset();
                                });
    group.reset();
    return outcome;
  }

  void ensure_staging(std::uint64_t bytes) {
    Staging& st = *staging;
    if (st.bytes >= bytes) return;
    // Old registrations stay with the group until it is destroyed; they are never used again.
    st.release();
    st.device = group->init().device;
    check_cuda(cudaSetDevice(st.device), "cudaSetDevice");
    if (st.copy_stream == nullptr && !apply_from_device) {
      check_cuda(cudaStreamCreateWithFlags(&st.copy_stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
    }
    for (int i = 0; i < 2; ++i) {
      check_cuda(cudaMalloc(&st.device_buffers[i], bytes), "device staging (cudaMalloc)");
      st.registrations[i] = group->register_device(st.device_buffers[i], bytes);
    }
    if (!apply_from_device) {
      check_cuda(cudaHostAlloc(&st.host, bytes, cudaHostAllocDefault),
                 "pinned staging (cudaHostAlloc)");
    }
    st.bytes = bytes;
  }
};

// The buckets of one broadcast update as the update loop takes them. Two receives in flight, as
// rank 0 sends them: bucket k+1 goes into the other device buffer (applied at k-1, free) before
// bucket k is waited for, and arrives while k is applied; so the loop applies one bucket at a
// time (not double buffered: the engine returns from a device bucket once its scatter finished,
// and then the buffer may receive bucket k+2).
class BroadcastBuckets final : public update::BucketSource {
 public:
  BroadcastBuckets(ReceiverGroup& entry, const std::vector<manifest::Manifest>& buckets,
                   std::chrono::milliseconds timeout, nccl::BroadcastGroup::Pending (&pending)[2],
                   std::string& phase)
      : entry_(entry), buckets_(buckets), timeout_(timeout), pending_(pending), phase_(phase) {}

  void begun() override {
    phase_ = "allocate staging";
    entry_.ensure_staging(nccl::largest_bucket(buckets_));
    if (buckets_.empty()) return;
    phase_ = "receive bucket 0";
    pending_[0] = entry_.group->issue(entry_.staging->registrations[0], 0,
                                      buckets_[0].bucket_bytes, 0, timeout_);
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
      pending_[1 - slot] = group.issue(st.registrations[1 - slot], 0, buckets_[k + 1].bucket_bytes,
                                       k + 1, timeout_);
    }
    phase_ = fmt::format("receive bucket {}", k);
    group.wait(pending_[slot]);
    phase_ = fmt::format("apply bucket {}", k);
    const std::uint64_t bytes = buckets_[k].bucket_bytes;
    out.manifest = buckets_[k];
    out.index = k;
    out.slot = static_cast<std::uint32_t>(slot);
    if (entry_.apply_from_device) {
      // The parameters live on this device: scattered straight from the received bucket.
      out.data = {static_cast<const std::byte*>(st.device_buffers[slot]), bytes};
      out.kind = FERRY_MEMORY_CUDA;
    } else {
      check_cuda(cudaMemcpyAsync(st.host, st.device_buffers[slot], bytes, cudaMemcpyDeviceToHost,
                                 st.copy_stream),
                 "copy a bucket off the device");
      check_cuda(cudaStreamSynchronize(st.copy_stream), "copy a bucket off the device");
      out.data = {static_cast<const std::byte*>(st.host), bytes};
      out.kind = FERRY_MEMORY_HOST;
    }
    ++next_;
    return true;
  }

 private:
  ReceiverGroup& entry_;
  const std::vector<manifest::Manifest>& buckets_;
  std::chrono::milliseconds timeout_;
  nccl::BroadcastGroup::Pending (&pending_)[2];
  std::string& phase_;
  std::uint32_t next_ = 0;
};

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
  init.device = device.cuda ? device.ordinal : 0;
  nccl::check_group_init(init);
  auto plugin = s.receiver.plugin_registry().transport(config.update.group_transport);
  logger("receiver")->info("joining weight-update group '{}' as rank {}/{} (rank 0 at {}:{})",
                           init.group_name, init.rank, init.world_size, init.master_address,
                           init.master_port);
  s.groups.init(init.group_name, [&] {
    auto entry = std::make_unique<ReceiverGroup>();
    entry->plugin = plugin;
    entry->apply_from_device = device.cuda;
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
  // Version 0 in the manifests: the engine checks only non-zero versions against the active one.
  const auto buckets = nccl::plan_buckets(request.tensors, request.bucket_bytes, 0);
  for (const auto& b : buckets) manifest::validate(b);

  std::vector<ferry_tensor_desc_t> catalog;
  catalog.reserve(request.tensors.size());
  for (const auto& t : request.tensors) {
    catalog.push_back(manifest::tensor_desc(t.name, t.dtype, t.shape));
  }

  std::unique_ptr<Receiver::StreamingUpdate> update;
  nccl::BroadcastGroup::Pending pending[2];
  std::string phase = "open the update";
  try {
    update = s.receiver.open_session(catalog, "");
    BroadcastBuckets source(entry, buckets, request.bucket_timeout, pending, phase);
    UpdateReport report =
        update->run(source, s.receiver.version().number + 1, request.weight_version, &phase);
    report.tensors = request.tensors.size();
    logger("receiver")->info("update {} ('{}') by broadcast in group '{}': {} buckets in {:.3f} s",
                             report.version.number, report.version.label, request.group_name,
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
    for (auto& p : pending) group.discard(p);
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

#else  // no NCCL in this build

struct WeightUpdateGroups::Impl {};

WeightUpdateGroups::WeightUpdateGroups(Receiver&) : impl_(std::make_unique<Impl>()) {}
WeightUpdateGroups::~WeightUpdateGroups() = default;

void WeightUpdateGroups::init(nccl::GroupInit) {
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "init_weights_update_group: this ferry was built without NCCL (-Dnccl, needs CUDA)");
}

UpdateReport WeightUpdateGroups::update(const DistributedUpdate&) {
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "update_weights_from_distributed: this ferry was built without NCCL (-Dnccl, needs CUDA)");
}

std::string WeightUpdateGroups::destroy(const std::string& group_name,
                                        std::chrono::milliseconds) {
  fail(FERRY_STATUS_NOT_FOUND, "no weight-update group '{}' (this ferry has no NCCL)",
       group_name);
}

#endif

}  // namespace ferry::receiver
