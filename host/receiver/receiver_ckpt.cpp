// receiver/receiver_ckpt.cpp: one checkpoint-engine update (SGLang's /update_weights_from_ipc)
// received through the ckpt_engine transport plugin, a bucket source of the update loop
// (receiver_ckpt.hpp).
#include "receiver/receiver_ckpt.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <utility>

#include "receiver/gpu_uuid.hpp"
#include "common/host_api.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "ferry_build_config.h"
#include "registry/registry.hpp"
#include "store/store_device.hpp"
#include "update/bucket_source.hpp"

#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry::receiver {
namespace {

// The transport plugin's source table, driven for one update.
class PluginSource final : public CkptBucketSource {
 public:
  PluginSource(std::shared_ptr<const registry::LoadedPlugin> plugin,
               const std::map<std::string, std::string>& options, int device,
               const std::string& address)
      : plugin_(std::move(plugin)), api_(plugin_->transport()) {
    const std::string& name = plugin_->info().name;
    const auto& caps = plugin_->info().transport_caps;
    if (api_ == nullptr || !caps || (caps->flags & FERRY_TRANSPORT_CAP_SOURCE) == 0 ||
        api_->source_open == nullptr || api_->source_catalog == nullptr ||
        api_->source_read == nullptr || api_->source_close == nullptr || api_->abort == nullptr) {
      ferry::fail(FERRY_STATUS_INCOMPATIBLE,
           "transport '{}' does not offer the checkpoint-engine worker (CAP_SOURCE and abort)",
           name);
    }
    std::vector<ferry_option_t> opts;
    for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = FERRY_ROLE_RECEIVER;
    args.options = opts.data();
    args.num_options = opts.size();
    args.device = device;
    throw_if_error(api_->create(&args, &transport_), "transport 'ckpt_engine' create");
    ferry_error_t* error = api_->source_open(transport_, address.c_str(), &source_);
    if (error != nullptr) {
      api_->destroy(transport_);
      transport_ = nullptr;
      throw_if_error(error, "transport 'ckpt_engine' connect");
    }
  }
  ~PluginSource() override { close(); }

  std::uint64_t open() override {
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    throw_if_error(api_->source_catalog(source_, &blob), "");
    std::vector<std::uint8_t> bytes;
    if (blob.data != nullptr) bytes.assign(blob.data, blob.data + blob.size);
    if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
    return manifest::decode(bytes).bucket_bytes;
  }

  bool read(void* dst, std::uint64_t capacity, std::vector<std::uint8_t>& manifest,
            std::uint64_t& bytes) override {
    ferry_source_read_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written);
    args.dst = dst;
    args.dst_capacity = capacity;
    args.manifest.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    ferry_error_t* error = api_->source_read(source_, &args);
    if (error != nullptr && error_code(error) == FERRY_STATUS_END_OF_STREAM) {
      ErrorPtr owned(error);
      return false;
    }
    throw_if_error(error, "");
    manifest.assign(args.manifest.data, args.manifest.data + args.manifest.size);
    if (args.manifest.release != nullptr) {
      args.manifest.release(args.manifest.data, args.manifest.release_ctx);
    }
    bytes = args.bytes_written;
    return true;
  }

  void fail(const std::string& reason) noexcept override {
    if (transport_ != nullptr) api_->abort(transport_, reason.c_str());
  }

  void close() noexcept override {
    if (source_ != nullptr) api_->source_close(source_);
    source_ = nullptr;
    if (transport_ != nullptr) api_->destroy(transport_);
    transport_ = nullptr;
  }

 private:
  std::shared_ptr<const registry::LoadedPlugin> plugin_;  // keeps the .so loaded
  const ferry_transport_api_t* api_ = nullptr;
  ferry_transport_t* transport_ = nullptr;
  ferry_source_t* source_ = nullptr;
};

// The buckets of one checkpoint-engine update as the update loop takes them: one at a time,
// into one staging buffer of the sender's largest bucket, allocated once the update began.
class UpdateBuckets final : public update::BucketSource {
 public:
  UpdateBuckets(CkptBucketSource& source, std::uint64_t max_bucket, const CkptStaging& staging,
                std::string& phase)
      : source_(source), max_bucket_(max_bucket), staging_(staging), phase_(phase) {}

  void begun() override {
    phase_ = "allocate staging";
    if (staging_.allocate) {
      dst_ = staging_.allocate(max_bucket_);
    } else {
      host_.resize(max_bucket_);
      dst_ = host_.data();
    }
  }

  bool next(std::uint32_t, update::Bucket& out) override {
    std::uint64_t bytes = 0;
    if (!source_.read(dst_, max_bucket_, out.manifest_bytes, bytes)) return false;
    out.data = {static_cast<const std::byte*>(dst_), static_cast<std::size_t>(bytes)};
    out.kind = staging_.kind;
    return true;
  }

 private:
  CkptBucketSource& source_;
  std::uint64_t max_bucket_ = 0;
  const CkptStaging& staging_;
  std::string& phase_;
  std::vector<std::byte> host_;
  void* dst_ = nullptr;
};

}  // namespace

UpdateReport apply_ckpt_engine_update(Receiver& receiver, CkptBucketSource& source,
                                      const std::optional<std::string>& label,
                                      const CkptStaging& staging) {
  std::unique_ptr<Receiver::StreamingUpdate> update;
  std::string phase = "receive the IPC handle";
  try {
    // The handle first: once it is answered (success or error) the sender never hangs.
    const std::uint64_t max_bucket = source.open();
    phase = "open the update";
    const auto catalog = receiver.checkpoint_catalog();
    if (catalog.empty()) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "the receiver has no model loaded: checkpoint-engine names no tensors before it sends "
           "them, so load the checkpoint first (update_weights_from_disk) or register the "
           "engine's parameters");
    }
    update = receiver.open_session(catalog, "");
    UpdateBuckets buckets(source, max_bucket, staging, phase);
    UpdateReport report = update->run(buckets, receiver.version().number + 1, label, &phase);
    source.close();  // the final answer: success
    logger("receiver")->info("update {} ('{}') from checkpoint-engine: {} tensors in {} buckets, "
                             "{:.3f} s",
                             report.version.number, report.version.label, report.tensors,
                             report.buckets, report.seconds);
    return report;
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    const ferry_status_code_t code = error != nullptr ? error->code() : FERRY_STATUS_INTERNAL;
    const std::string reason =
        fmt::format("checkpoint-engine update failed during phase '{}': {}", phase, e.what());
    update.reset();
    source.fail(reason);
    source.close();
    logger("receiver")->warn("{}", reason);
    throw Error(code, reason);
  }
}

UpdateReport update_weights_from_ipc(Receiver& receiver,
                                     [[maybe_unused]] const IpcUpdateRequest& request) {
  const auto& config = receiver.receiver_config();
  const auto device = store::parse_store_device(config.receiver.device);
  if (!device.cuda) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "update_weights_from_ipc needs a CUDA receiver (receiver.device = cuda:N): "
         "checkpoint-engine shares its buffer by CUDA IPC, and this receiver runs on '{}'",
         config.receiver.device);
  }
#if FERRY_HAVE_CUDA
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, device.ordinal) != cudaSuccess) {
    fail(FERRY_STATUS_NOT_FOUND, "update_weights_from_ipc: cannot read CUDA device {}'s UUID",
         device.ordinal);
  }
  unsigned char uuid_bytes[16];
  std::memcpy(uuid_bytes, props.uuid.bytes, sizeof(uuid_bytes));
  const std::string uuid = ckpt_engine::format_gpu_uuid(uuid_bytes);
  const std::string address = ckpt_engine::pick_address(request.zmq_handles, uuid);

  std::map<std::string, std::string> options;
  const std::string& transport = config.update.ckpt_engine_transport;
  if (auto it = config.transports.find(transport); it != config.transports.end()) {
    options = it->second;
  }
  if (request.timeout_s) options["receive_timeout_s"] = fmt::format("{}", *request.timeout_s);
  auto plugin = receiver.plugin_registry().transport(transport);
  logger("receiver")->info("checkpoint-engine update from {} (this GPU: {})", address, uuid);
  PluginSource source(plugin, options, device.ordinal, address);

  struct DeviceStaging {
    void* ptr = nullptr;
    ~DeviceStaging() {
      if (ptr != nullptr) cudaFree(ptr);
    }
  } memory;
  CkptStaging staging;
  staging.kind = FERRY_MEMORY_CUDA;
  staging.allocate = [&memory, ordinal = device.ordinal](std::uint64_t bytes) -> void* {
    cudaSetDevice(ordinal);
    const cudaError_t e = cudaMalloc(&memory.ptr, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      fail(e == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
           "device staging of {} bytes for checkpoint-engine buckets: {}", bytes,
           cudaGetErrorString(e));
    }
    return memory.ptr;
  };
  return apply_ckpt_engine_update(receiver, source, request.weight_version, staging);
#else
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "update_weights_from_ipc: this ferry was built without CUDA (-Dcuda), which "
       "checkpoint-engine's CUDA IPC buffer needs");
#endif
}

}  // namespace ferry::receiver
