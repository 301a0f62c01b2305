// group/trainer_group.cpp: rank 0 of an NCCL weight-update group: rendezvous, double-buffered
// packing and bucketed broadcast through the nccl transport (see trainer_group.hpp).
#include "group/trainer_group.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <atomic>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/host_api.hpp"
#include "common/log.hpp"
#include "ferry_build_config.h"
#include "group/broadcast_group.hpp"
#include "order/stream_order.hpp"
#include "registry/registry.hpp"

#if FERRY_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ferry::session {
namespace {

std::vector<nccl::TensorSpec> specs_of(const std::vector<TensorView>& tensors) {
  std::vector<std::string> names, dtypes;
  std::vector<std::vector<std::uint64_t>> shapes;
  for (const auto& t : tensors) {
    names.push_back(t.name);
    dtypes.push_back(dtype_name(t.dtype));
    shapes.push_back(t.shape);
  }
  return nccl::make_tensor_specs(names, dtypes, shapes);
}

}  // namespace

#if FERRY_HAVE_NCCL

namespace {
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(e == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
         "{}: {}", what, cudaGetErrorString(e));
  }
}
}  // namespace

struct NcclTrainerGroup::Impl {
  std::shared_ptr<const registry::LoadedPlugin> plugin;
  NcclTrainerOptions options;
  // Staging outlives the group object that registered it (reset group first).
  void* buffers[2] = {nullptr, nullptr};
  std::uint64_t buffer_bytes = 0;
  cudaStream_t pack_stream = nullptr;
  std::unique_ptr<nccl::BroadcastGroup> group;
  ferry_memory_t* registrations[2] = {nullptr, nullptr};
  std::atomic<bool> failed{false};
  std::mutex reason_mutex;
  std::string failure;  // guarded by reason_mutex

  void mark_failed(const std::string& reason) noexcept {
    if (group) group->abort(reason);
    failed.store(true);
    try {
      std::lock_guard lock(reason_mutex);
      failure = reason;
    } catch (...) {
      // The flag is what matters; the reason is for messages.
    }
  }

  // Hands the staging buffers to whoever frees them after the communicator is gone.
  std::function<void()> release_buffers() {
    const int device = options.device;
    void* owned[2] = {buffers[0], buffers[1]};
    buffers[0] = buffers[1] = nullptr;
    buffer_bytes = 0;
    registrations[0] = registrations[1] = nullptr;
    return [device, b0 = owned[0], b1 = owned[1], keep = plugin] {
      cudaSetDevice(device);
      if (b0 != nullptr) cudaFree(b0);
      if (b1 != nullptr) cudaFree(b1);
    };
  }

  // Leaves the group (see BroadcastGroup::close); the staging is freed after the communicator.
  nccl::BroadcastGroup::CloseOutcome close_group(nccl::Clock::time_point deadline, bool healthy) {
    if (!group) {
      release_buffers()();
      return nccl::BroadcastGroup::CloseOutcome::aborted;
    }
    auto outcome = group->close(deadline, healthy, release_buffers());
    group.reset();
    return outcome;
  }

  void join() {
    // A stale communicator goes first (aborted: the receivers re-init too).
    close_group(nccl::Clock::now() + nccl::kDefaultCloseTimeout, false);
    nccl::GroupInit init;
    init.master_address = options.master_address;
    init.master_port = options.master_port;
    init.world_size = options.world_size;
    init.group_name = options.group_name;
    init.rank = 0;
    init.device = options.device;
    init.init_timeout = options.init_timeout;
    group = std::make_unique<nccl::BroadcastGroup>(plugin->transport(), host_api_table(), init);
    failed.store(false);
    logger("session")->info("weight-update group '{}': rank 0 of {} ready on {}:{}",
                            options.group_name, options.world_size, options.master_address,
                            options.master_port);
  }

  void ensure_buffers(std::uint64_t bytes) {
    if (buffer_bytes >= bytes) return;
    // Registrations of the old buffers stay with the group (never used again); the buffers are
    // idle here (every broadcast was waited for).
    release_buffers()();
    check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
    if (pack_stream == nullptr) {
      check_cuda(cudaStreamCreateWithFlags(&pack_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    for (int i = 0; i < 2; ++i) {
      check_cuda(cudaMalloc(&buffers[i], bytes), "bucket staging (cudaMalloc)");
      registrations[i] = group->register_device(buffers[i], bytes);
    }
    buffer_bytes = bytes;
  }
};

NcclTrainerGroup::NcclTrainerGroup(const registry::Registry& registry, NcclTrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  nccl::check_bucket_bytes(options.bucket_bytes);
  impl_->plugin = registry.transport(options.transport);
  impl_->options = std::move(options);
  impl_->join();
}

NcclTrainerGroup::~NcclTrainerGroup() {
  try {
    close(std::chrono::duration_cast<std::chrono::milliseconds>(nccl::kDefaultCloseTimeout));
  } catch (...) {
    // A destructor must not throw; close() throws only when no thread can start.
  }
  if (impl_->pack_stream != nullptr) cudaStreamDestroy(impl_->pack_stream);
}

std::string NcclTrainerGroup::close(std::chrono::milliseconds timeout) {
  auto& s = *impl_;
  if (!s.group) return "closed";
  const auto outcome = s.close_group(nccl::Clock::now() + timeout, !s.failed.load());
  s.failed.store(true);
  {
    std::lock_guard lock(s.reason_mutex);
    s.failure = "the group was destroyed (close())";
  }
  const char* how = nccl::close_outcome_name(outcome);
  logger("session")->info("weight-update group '{}' destroyed ({})", s.options.group_name, how);
  return how;
}

void NcclTrainerGroup::reinit() { impl_->join(); }

void NcclTrainerGroup::abort(const std::string& reason) noexcept { impl_->mark_failed(reason); }

bool NcclTrainerGroup::failed() const { return impl_->failed.load(); }

BroadcastReport NcclTrainerGroup::broadcast(const std::vector<TensorView>& tensors) {
  auto& s = *impl_;
  if (s.failed.load()) {
    std::lock_guard lock(s.reason_mutex);
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "weight-update group '{}' failed earlier ({}); reinit() it and the receivers",
         s.options.group_name, s.failure);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto buckets = nccl::plan_buckets(specs_of(tensors), s.options.bucket_bytes, 0);
  for (const auto& t : tensors) {
    if (t.data == nullptr && byte_size(t.dtype, t.shape).value_or(0) > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "tensor '{}' has no data pointer", t.name);
    }
    if (t.memory_kind == FERRY_MEMORY_CUDA && t.device != s.options.device) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "tensor '{}' is on CUDA device {} but rank 0 of group '{}' uses device {}", t.name,
           t.device, s.options.group_name, s.options.device);
    }
  }
  // The packing copies run on a stream of ferry's: they may read the tensors only once the work
  // that produced them is done (a trainer broadcasts right after its optimizer step, whose
  // kernels may still be queued): the group's device is synchronised (order/stream_order.hpp).
  order::wait(order::StreamOrder{}, std::vector<int>{s.options.device},
              fmt::format("broadcast of weight-update group '{}'", s.options.group_name));
  nccl::BroadcastGroup& group = *s.group;
  nccl::BroadcastGroup::Pending pending[2];
  std::string phase = "allocate staging";
  BroadcastReport report;
  try {
    s.ensure_buffers(nccl::largest_bucket(buckets));
    std::size_t next_tensor = 0;
    // Packs bucket k into buffer `slot` on the pack stream (async; cudaMemcpyDefault serves host
    // and device sources alike).
    auto pack = [&](std::size_t k, int slot) {
      auto* dst = static_cast<std::uint8_t*>(s.buffers[slot]);
      for (const auto& e : buckets[k].tensors) {
        const TensorView& t = tensors[next_tensor++];
        if (e.size == 0) continue;
        check_cuda(cudaMemcpyAsync(dst + e.offset, t.data, e.size, cudaMemcpyDefault,
                                   s.pack_stream),
                   "pack a tensor into its bucket");
      }
    };
    const std::size_t count = buckets.size();
    check_cuda(cudaSetDevice(s.options.device), "cudaSetDevice");
    // Two broadcasts in flight: bucket k+1 is enqueued before bucket k is waited for, so the
    // host's per-bucket work (the wait's return, the next issue) never leaves the GPU idle; the
    // buffer a finished bucket frees is packed with bucket k+2 while k+1 travels.
    phase = "pack bucket 0";
    pack(0, 0);
    check_cuda(cudaStreamSynchronize(s.pack_stream), "pack bucket 0");
    pending[0] = group.issue(s.registrations[0], 0, buckets[0].bucket_bytes, 0,
                             s.options.bucket_timeout);
    if (count > 1) {
      phase = "pack bucket 1";
      pack(1, 1);
    }
    for (std::size_t k = 0; k < count; ++k) {
      const int slot = static_cast<int>(k % 2);
      if (k + 1 < count) {
        phase = fmt::format("pack bucket {}", k + 1);
        check_cuda(cudaStreamSynchronize(s.pack_stream), "pack a bucket");
        pending[1 - slot] = group.issue(s.registrations[1 - slot], 0, buckets[k + 1].bucket_bytes,
                                        static_cast<std::uint32_t>(k + 1),
                                        s.options.bucket_timeout);
      }
      phase = fmt::format("broadcast bucket {}", k);
      group.wait(pending[slot]);
      report.bytes += buckets[k].bucket_bytes;
      if (k + 2 < count) {
        phase = fmt::format("pack bucket {}", k + 2);
        pack(k + 2, slot);  // into the buffer bucket k just freed
      }
    }
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    const ferry_status_code_t code = error != nullptr ? error->code() : FERRY_STATUS_INTERNAL;
    const std::string reason = fmt::format("weight-update group '{}' broadcast failed during "
                                           "phase '{}': {}",
                                           s.options.group_name, phase, e.what());
    for (auto& p : pending) group.discard(p);
    cudaStreamSynchronize(s.pack_stream);
    s.mark_failed(reason);
    logger("session")->warn("{}", reason);
    throw Error(code, reason);
  }
  report.tensors = tensors.size();
  report.buckets = buckets.size();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

#else  // no NCCL in this build

struct NcclTrainerGroup::Impl {
  NcclTrainerOptions options;
};

NcclTrainerGroup::NcclTrainerGroup(const registry::Registry&, NcclTrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "NCCL weight-update group '{}': this ferry was built without NCCL (-Dnccl, needs CUDA)",
       impl_->options.group_name);
}
NcclTrainerGroup::~NcclTrainerGroup() = default;
std::string NcclTrainerGroup::close(std::chrono::milliseconds) { return "closed"; }
BroadcastReport NcclTrainerGroup::broadcast(const std::vector<TensorView>&) { return {}; }
void NcclTrainerGroup::reinit() {}
void NcclTrainerGroup::abort(const std::string&) noexcept {}
bool NcclTrainerGroup::failed() const { return true; }

#endif

std::string NcclTrainerGroup::update_request(
    const std::vector<TensorView>& tensors,
    const std::optional<std::string>& weight_version) const {
  specs_of(tensors);  // the same checks the receivers apply
  nlohmann::json body;
  auto& names = body["names"] = nlohmann::json::array();
  auto& dtypes = body["dtypes"] = nlohmann::json::array();
  auto& shapes = body["shapes"] = nlohmann::json::array();
  for (const auto& t : tensors) {
    names.push_back(t.name);
    dtypes.push_back(dtype_name(t.dtype));
    shapes.push_back(t.shape);
  }
  body["group_name"] = impl_->options.group_name;
  body["bucket_bytes"] = impl_->options.bucket_bytes;
  body["timeout_s"] = std::chrono::duration<double>(impl_->options.bucket_timeout).count();
  if (weight_version) body["weight_version"] = *weight_version;
  return body.dump();
}

}  // namespace ferry::session
