// The data path through a transport plugin's C table (see session/data_path.hpp): staging slots
// registered with the plugin; buckets move by put+flush into the receiver's slots when the plugin
// writes remote memory natively, otherwise by send_bucket into a recv_bucket the receiver posted.
// With a device transport (one that reads and writes CUDA memory, e.g. cuda_ipc) the receiver's
// slots are device memory of its GPU and the sender puts CUDA tensors straight into them.
#include <ferry/sdk/error.hpp>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "common/host_api.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/data_path.hpp"
#include "session/device_memory.hpp"

namespace ferry::session {
namespace {

std::int64_t to_ns(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
}

std::vector<std::uint8_t> take_blob(ferry_blob_t& blob) {
  std::vector<std::uint8_t> bytes;
  if (blob.data != nullptr && blob.size > 0) bytes.assign(blob.data, blob.data + blob.size);
  if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
  blob = ferry_blob_t{};
  return bytes;
}

ferry_blob_t empty_blob() {
  ferry_blob_t b{};
  b.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  return b;
}

ferry_blob_t borrow_blob(std::span<const std::uint8_t> bytes) {
  ferry_blob_t b = empty_blob();
  b.data = bytes.data();
  b.size = bytes.size();
  return b;
}

// A staging slot: host memory (SlotBuffer), host memory the transport allocated (plugin ABI
// 1.7 alloc_memory; the transport frees it when its registration goes) or device memory of one
// GPU (cudaMalloc, shared by the plugin as a legacy CUDA IPC allocation).
class StagingSlot {
 public:
  // Memory the transport owns: this slot only borrows it.
  explicit StagingSlot(std::span<std::byte> transport_owned) : bytes_(transport_owned) {}
  StagingSlot(std::uint64_t capacity, int device) : device_(device) {
    if (device < 0) {
      host_.emplace(capacity);
      bytes_ = host_->bytes();
      return;
    }
#if FERRY_HAVE_CUDA
    int previous = 0;
    cudaError_t e = cudaGetDevice(&previous);
    if (e == cudaSuccess) e = cudaSetDevice(device);
    void* p = nullptr;
    if (e == cudaSuccess) e = cudaMalloc(&p, capacity);
    (void)cudaSetDevice(previous);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(FERRY_STATUS_OUT_OF_MEMORY,
           "staging slot of {} bytes on CUDA device {}: {}", capacity, device,
           cudaGetErrorString(e));
    }
    bytes_ = {static_cast<std::byte*>(p), capacity};
#else
    fail(FERRY_STATUS_UNIMPLEMENTED, "device staging slots need a build with CUDA");
#endif
  }
  ~StagingSlot() {
#if FERRY_HAVE_CUDA
    if (device_ >= 0 && bytes_.data() != nullptr) (void)cudaFree(bytes_.data());
#endif
  }
  StagingSlot(StagingSlot&& o) noexcept
      : device_(o.device_), host_(std::move(o.host_)), bytes_(std::exchange(o.bytes_, {})) {}
  StagingSlot(const StagingSlot&) = delete;
  StagingSlot& operator=(const StagingSlot&) = delete;
  StagingSlot& operator=(StagingSlot&&) = delete;
  std::span<std::byte> bytes() const noexcept { return bytes_; }

 private:
  int device_ = -1;
  std::optional<SlotBuffer> host_;
  std::span<std::byte> bytes_;
};

// A device transport: it shares CUDA memory between processes of one node (cuda_ipc); its
// receivers need device slots, and it writes the peer's memory natively (nothing to probe).
bool is_device_transport(const ferry_transport_caps_t& caps) {
  return (caps.flags & FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) != 0 &&
         (caps.memory_kinds & FERRY_MEMORY_CUDA) != 0;
}

// A transport that moves CUDA memory (a device transport, or UCX built with CUDA), used by a side
// whose weights are on a GPU: the receiver's slots are device memory and the sender's CUDA
// tensors are registered as they are, so no byte goes through host memory on ferry's account.
bool moves_device_memory(const ferry_transport_caps_t& caps, int device) {
  return device >= 0 && (caps.memory_kinds & FERRY_MEMORY_CUDA) != 0;
}

// One plugin instance with its registered slots; shared by both roles. The receiver registers
// its slots at once (their keys go into the Welcome); the sender registers its host slots on
// first use (a sender that delivers CUDA tensors piece by piece never needs them) and the
// memory of the tensors it puts from, once per session.
// The plugin ABI minor from which a put's fingerprint_out is FERRY_FINGERPRINT_ALGORITHM.
constexpr std::uint32_t kPutFingerprintMinor = 6;
// The plugin ABI minor from which the transport may allocate the receiver's staging slots.
constexpr std::uint32_t kAllocMemoryMinor = 7;
// The plugin ABI minor from which a put may ask for its chunk hashes (chunk_hashes_out).
constexpr std::uint32_t kPutChunkHashesMinor = 8;
// The plugin ABI minor from which the table may hold prepare_puts.
constexpr std::uint32_t kPreparePutsMinor = 9;
// The plugin ABI minor from which the table may hold map_peer_memory.
constexpr std::uint32_t kMapPeerMemoryMinor = 10;

class PluginInstance {
 public:
  PluginInstance(const registry::Registry& registry, const config::Config& config,
                 const std::string& name, ferry_role_t role, std::uint64_t capacity,
                 std::size_t slots, int device)
      : plugin_(registry.transport(name)),
        name_(name),
        role_(role),
        capacity_(capacity),
        slots_(slots) {
    api_ = plugin_->transport();
    const auto& caps = plugin_->info().transport_caps;
    if (api_ == nullptr || !caps || api_->get_address == nullptr || api_->connect == nullptr ||
        api_->register_memory == nullptr) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "transport '{}' cannot carry sessions (needs get_address, connect, register_memory)",
           name);
    }
    caps_ = *caps;
    const bool can_put = (caps_.flags & FERRY_TRANSPORT_CAP_DIRECT_WRITE) != 0 &&
                         api_->put != nullptr && api_->flush != nullptr &&
                         api_->pack_key != nullptr;
    const bool can_send = api_->send_bucket != nullptr && api_->recv_bucket != nullptr;
    if (!can_put && !can_send) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "transport '{}' has neither put+flush+pack_key nor send_bucket+recv_bucket", name);
    }
    rma_native_ = can_put;
    can_send_ = can_send;
    maps_peer_ = can_put && api_->map_peer_memory != nullptr &&
                 plugin_->info().abi_minor >= kMapPeerMemoryMinor;
    device_transport_ = is_device_transport(caps_);
    if (role == FERRY_ROLE_RECEIVER && device_transport_ && device < 0) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "transport '{}' moves CUDA memory only; this receiver keeps its weights on the cpu "
           "(serve with --device cuda:N)",
           name);
    }
    // Receiver slots live on the receiver's GPU whenever the transport moves CUDA memory (a
    // network transport's GPU receiver too: UCX with CUDA lands buckets in them directly).
    device_memory_ = device_transport_ || moves_device_memory(caps_, device);
    slot_device_ = role == FERRY_ROLE_RECEIVER && device_memory_ ? device : -1;
    std::map<std::string, std::string> options;
    if (auto it = config.transports.find(name); it != config.transports.end()) options = it->second;
    std::vector<ferry_option_t> opts;
    for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = role;
    args.options = opts.data();
    args.num_options = opts.size();
    args.device = device_memory_ ? device : -1;
    throw_if_error(api_->create(&args, &transport_), "transport '" + name + "' create");
    try {
      if (role == FERRY_ROLE_RECEIVER) {
        for (std::size_t i = 0; i < slots; ++i) register_slot();
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~PluginInstance() { destroy(); }

  void destroy() noexcept {
    if (transport_ == nullptr) return;
    if (peer_ != nullptr && api_->disconnect != nullptr) api_->disconnect(transport_, peer_);
    peer_ = nullptr;
    if (api_->deregister_memory != nullptr) {
      for (auto* m : memory_) api_->deregister_memory(transport_, m);
      for (auto& [range, m] : local_) api_->deregister_memory(transport_, m);
      for (auto& [range, lent] : lent_) api_->deregister_memory(transport_, lent.memory);
    }
    lent_.clear();
    memory_.clear();
    local_.clear();
    api_->destroy(transport_);
    transport_ = nullptr;
    buffers_.clear();  // after the plugin let go of them
  }

  ferry_memory_t* register_range(void* base, std::uint64_t size, ferry_memory_kind_t kind,
                                 int device) {
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.base = base;
    desc.size = size;
    desc.kind = kind;
    desc.device = device;
    ferry_memory_t* memory = nullptr;
    throw_if_error(api_->register_memory(transport_, &desc, &memory), context("register_memory"));
    return memory;
  }

  // A receiver's host slot allocated and registered by the transport (ABI 1.7 alloc_memory:
  // memory its peer reaches faster, e.g. UCX shared memory mapped into the sender), or nullopt
  // where the plugin has no alloc_memory or declines (UNIMPLEMENTED): the host allocates it.
  struct Allocated {
    void* data = nullptr;
    ferry_memory_t* memory = nullptr;
  };
  std::optional<Allocated> alloc_slot() {
    if (role_ != FERRY_ROLE_RECEIVER || slot_device_ >= 0 || api_->alloc_memory == nullptr ||
        plugin_->info().abi_minor < kAllocMemoryMinor) {
      return std::nullopt;
    }
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.size = capacity_;
    desc.kind = FERRY_MEMORY_HOST;
    desc.device = -1;
    void* data = nullptr;
    ferry_memory_t* memory = nullptr;
    ferry_error_t* error = api_->alloc_memory(transport_, &desc, &data, &memory);
    if (error != nullptr && host_api_table()->error_code(error) == FERRY_STATUS_UNIMPLEMENTED) {
      logger("session")->debug("transport '{}' allocates no staging slots: {}", name_,
                               host_api_table()->error_message(error));
      host_api_table()->error_free(error);
      return std::nullopt;
    }
    throw_if_error(error, context("alloc_memory"));
    if (data == nullptr || reinterpret_cast<std::uintptr_t>(data) % FERRY_BUCKET_ALIGNMENT != 0) {
      if (api_->deregister_memory != nullptr) api_->deregister_memory(transport_, memory);
      fail(FERRY_STATUS_INTERNAL,
           "transport '{}' alloc_memory returned {}, not aligned to {} bytes", name_, data,
           FERRY_BUCKET_ALIGNMENT);
    }
    return Allocated{data, memory};
  }

  void register_slot() {
    if (auto allocated = alloc_slot()) {
      memory_.push_back(allocated->memory);  // first: destroy() frees it whatever follows
      buffers_.emplace_back(std::span<std::byte>(static_cast<std::byte*>(allocated->data),
                                                 capacity_));
      ++transport_slots_;
      return;
    }
    buffers_.emplace_back(capacity_, slot_device_);
    memory_.push_back(register_range(buffers_.back().bytes().data(), capacity_,
                                     slot_device_ >= 0 ? FERRY_MEMORY_CUDA : FERRY_MEMORY_HOST,
                                     slot_device_));
  }

  // Slot `index`, registering the slots up to it on first use (sender).
  std::span<std::byte> slot(std::uint32_t index) {
    if (index >= slots_) fail(FERRY_STATUS_INVALID_ARGUMENT, "staging slot {} of {}", index, slots_);
    while (buffers_.size() <= index) register_slot();
    return buffers_.at(index).bytes();
  }

  // The staging slots go: deregistered, then freed (receiver, direct delivery).
  void release_slots() noexcept {
    if (api_->deregister_memory != nullptr) {
      for (auto* m : memory_) api_->deregister_memory(transport_, m);
    }
    memory_.clear();
    buffers_.clear();
    transport_slots_ = 0;
  }

  // Drops the registrations of tensors' memory (the tensors need not outlive a push).
  void forget_local() noexcept {
    if (api_->deregister_memory != nullptr) {
      for (auto& [range, m] : local_) api_->deregister_memory(transport_, m);
    }
    local_.clear();
  }

  // Reads in place: the key of a CUDA tensor's memory lent to the receiver, registered once
  // and kept across pushes (marked as lent by push `push`).
  std::vector<std::uint8_t> lend(const void* data, std::uint64_t size, int device,
                                 std::uint64_t push) {
    const auto range = std::make_pair(reinterpret_cast<std::uintptr_t>(data), size);
    auto it = lent_.find(range);
    if (it == lent_.end()) {
      auto* m = register_range(const_cast<void*>(data), size, FERRY_MEMORY_CUDA, device);
      Lent lent{m, {}, push, device_allocation(data)};
      try {
        ferry_blob_t blob = empty_blob();
        throw_if_error(api_->pack_key(transport_, m, &blob), context("pack_key"));
        lent.key = take_blob(blob);
      } catch (...) {
        if (api_->deregister_memory != nullptr) api_->deregister_memory(transport_, m);
        throw;
      }
      it = lent_.emplace(range, std::move(lent)).first;
    }
    it->second.push = push;
    return it->second.key;
  }

  // A registration stands for the allocation under the tensor when it was made. Where another
  // allocation lies there now (the trainer freed its tensors and made new ones at the same
  // addresses), it goes, and with it the receiver's mapping of the old memory (the plugin tells
  // the peer, whose next import lets it go); the push lends the tensor again. Each allocation
  // is asked once.
  void check_lent() {
    const auto start = Clock::now();
    std::map<std::uintptr_t, bool> same;  // by allocation base
    std::size_t stale = 0;
    for (auto it = lent_.begin(); it != lent_.end();) {
      const auto& a = it->second.allocation;
      if (a) {
        auto [at, added] = same.try_emplace(a->base, false);
        if (added) at->second = still_allocated(*a);
        if (!at->second) {
          if (api_->deregister_memory != nullptr)
            api_->deregister_memory(transport_, it->second.memory);
          it = lent_.erase(it);
          ++stale;
          continue;
        }
      }
      ++it;
    }
    logger("sender")->debug(
        "lent memory checked: {} allocation(s) in {:.3f} ms; {} lent tensor(s) lie in other "
        "allocations than when they were lent (freed and made again at the same addresses) and "
        "are lent again",
        same.size(), std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
        stale);
  }

  // Lets go of the lent memory that push `push` did not lend (the trainer's tensors moved).
  void forget_lent_before(std::uint64_t push) noexcept {
    for (auto it = lent_.begin(); it != lent_.end();) {
      if (it->second.push >= push) {
        ++it;
        continue;
      }
      if (api_->deregister_memory != nullptr)
        api_->deregister_memory(transport_, it->second.memory);
      it = lent_.erase(it);
    }
  }

  // The registration of a tensor's memory the sender puts from; registered once per push.
  ferry_memory_t* local(const void* data, std::uint64_t size, ferry_memory_kind_t kind,
                        int device) {
    const auto key = std::make_tuple(reinterpret_cast<std::uintptr_t>(data), size,
                                     static_cast<int>(kind));
    if (auto it = local_.find(key); it != local_.end()) return it->second;
    auto* m = register_range(const_cast<void*>(data), size, kind,
                             kind == FERRY_MEMORY_CUDA ? device : -1);
    local_.emplace(key, m);
    return m;
  }

  std::vector<std::uint8_t> address() {
    ferry_blob_t blob = empty_blob();
    throw_if_error(api_->get_address(transport_, &blob), context("get_address"));
    return take_blob(blob);
  }

  std::vector<std::uint8_t> slot_key(std::uint32_t slot) {
    if (!rma_native_) return {};
    ferry_blob_t blob = empty_blob();
    try {
      throw_if_error(api_->pack_key(transport_, memory_.at(slot), &blob), context("pack_key"));
    } catch (const Error& e) {
      logger("session")->info("no RMA into staging slots: {}", e.what());
      rma_native_ = false;
      return {};
    }
    return take_blob(blob);
  }

  void connect(std::span<const std::uint8_t> remote, const std::string& peer, std::uint32_t rank,
               Clock::time_point deadline) {
    ferry_blob_t blob = borrow_blob(remote);
    ferry_connect_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    args.remote_addresses = &blob;
    args.num_remote = 1;
    args.local_rank = rank;
    args.group_size = 2;
    args.peer_name = peer.c_str();
    args.deadline_ns = to_ns(deadline);
    throw_if_error(api_->connect(transport_, &args, &peer_), context("connect to " + peer));
  }

  // Waits for and frees a request (NULL: already complete).
  void finish(ferry_request_t* request, Clock::time_point deadline, const std::string& what) {
    if (request == nullptr) return;
    ferry_error_t* error = nullptr;
    if (api_->request_wait != nullptr) {
      error = api_->request_wait(transport_, request, to_ns(deadline));
    } else if (api_->request_test != nullptr) {
      int done = 0;
      while (error == nullptr && !done) {
        error = api_->request_test(transport_, request, &done);
        if (!done && Clock::now() > deadline) {
          error = host_api_table()->error_new(FERRY_STATUS_TIMEOUT, "deadline passed");
        }
      }
    }
    if (api_->request_free != nullptr) api_->request_free(transport_, request);
    throw_if_error(error, context(what));
  }

  ferry_memory_range_t range(std::uint32_t slot, std::uint64_t bytes) {
    (void)this->slot(slot);
    return whole(memory_.at(slot), bytes);
  }

  static ferry_memory_range_t whole(ferry_memory_t* memory, std::uint64_t bytes) {
    ferry_memory_range_t r{};
    r.struct_size = FERRY_STRUCT_SIZE(ferry_memory_range_t, size);
    r.memory = memory;
    r.offset = 0;
    r.size = bytes;
    return r;
  }

  ferry_bucket_io_t bucket_io(std::uint32_t slot, std::uint32_t index, std::uint64_t bytes,
                              Clock::time_point deadline) {
    ferry_bucket_io_t io{};
    io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
    io.data = range(slot, bytes);
    io.bucket_index = index;
    io.deadline_ns = to_ns(deadline);
    return io;
  }

  void abort(const std::string& reason) noexcept {
    if (transport_ != nullptr && api_->abort != nullptr) api_->abort(transport_, reason.c_str());
  }

  std::string context(const std::string& call) const {
    return "transport '" + name_ + "' " + call;
  }

  const ferry_transport_api_t* api_ = nullptr;
  std::shared_ptr<registry::LoadedPlugin> plugin_;
  std::string name_;
  ferry_role_t role_ = FERRY_ROLE_SENDER;
  ferry_transport_caps_t caps_{};
  std::uint64_t capacity_ = 0;
  std::size_t slots_ = 0;
  ferry_transport_t* transport_ = nullptr;
  ferry_peer_t* peer_ = nullptr;
  std::vector<StagingSlot> buffers_;
  std::vector<ferry_memory_t*> memory_;  // of buffers_, in order
  std::size_t transport_slots_ = 0;      // of buffers_, allocated by the transport (alloc_memory)
  // Tensor memory the sender put from: (address, bytes, kind) -> registration.
  std::map<std::tuple<std::uintptr_t, std::uint64_t, int>, ferry_memory_t*> local_;
  int slot_device_ = -1;           // receiver: the GPU its slots are on; -1: host slots
  bool device_transport_ = false;  // see is_device_transport()
  bool device_memory_ = false;     // see moves_device_memory()
  bool rma_native_ = false;        // put + flush + pack_key exist
  bool maps_peer_ = false;         // and map_peer_memory (ABI 1.10)
  // Tensors' memory lent to the receiver (reads in place): (address, bytes) -> registration,
  // its packed key, and the last push that lent it.
  struct Lent {
    ferry_memory_t* memory = nullptr;
    std::vector<std::uint8_t> key;
    std::uint64_t push = 0;
    std::optional<DeviceAllocation> allocation;  // under it when it was registered
  };
  std::map<std::pair<std::uintptr_t, std::uint64_t>, Lent> lent_;
  bool can_send_ = false;          // send_bucket + recv_bucket exist
};

class PluginReceiverPath final : public ReceiverDataPath {
 public:
  PluginReceiverPath(const registry::Registry& registry, const config::Config& config,
                     const std::string& name, std::uint64_t capacity, std::size_t slots,
                     int device)
      : p_(registry, config, name, FERRY_ROLE_RECEIVER, capacity, slots, device),
        posted_(slots, nullptr) {}
  ~PluginReceiverPath() override {
    for (auto* r : posted_) {
      if (r != nullptr && p_.api_->request_free != nullptr) p_.api_->request_free(p_.transport_, r);
    }
  }
  std::string name() const override { return p_.name_; }
  std::size_t slot_count() const override { return p_.slots_; }
  std::span<std::byte> slot(std::uint32_t index) override {
    return p_.buffers_.at(index).bytes();
  }
  ferry_memory_kind_t slot_kind() const override {
    return p_.slot_device_ >= 0 ? FERRY_MEMORY_CUDA : FERRY_MEMORY_HOST;
  }
  std::vector<std::uint8_t> address() override { return p_.address(); }
  std::vector<std::uint8_t> slot_key(std::uint32_t slot) override { return p_.slot_key(slot); }
  std::vector<std::uint8_t> share_region(void* base, std::uint64_t bytes) override {
    if (!p_.rma_native_ || !p_.device_memory_ || p_.slot_device_ < 0) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "transport '{}' cannot put into device memory here",
           p_.name_);
    }
    auto* memory = p_.local(base, bytes, FERRY_MEMORY_CUDA, p_.slot_device_);
    ferry_blob_t blob = empty_blob();
    throw_if_error(p_.api_->pack_key(p_.transport_, memory, &blob), p_.context("pack_key"));
    return take_blob(blob);
  }
  bool rma_native() const override { return p_.rma_native_; }
  void connect(std::span<const std::uint8_t> sender_address, const std::string& peer,
               Clock::time_point deadline) override {
    p_.connect(sender_address, peer, 1, deadline);
  }
  void set_via_put(bool via_put) override { via_put_ = via_put; }
  void post(std::uint32_t slot, std::uint32_t bucket_index, Clock::time_point deadline) override {
    if (via_put_) return;
    auto io = p_.bucket_io(slot, bucket_index, p_.buffers_.at(slot).bytes().size(), deadline);
    ferry_request_t* request = nullptr;
    throw_if_error(p_.api_->recv_bucket(p_.transport_, p_.peer_, &io, &request),
                   p_.context("recv_bucket"));
    posted_.at(slot) = request;
    posted_index_[slot] = bucket_index;
  }
  void receive(Channel& channel, std::uint32_t slot, std::uint32_t bucket_index,
               std::uint64_t /*bytes*/, bool data_follows, Clock::time_point deadline,
               const std::string& phase) override {
    if (data_follows) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: a data frame was announced on the {} data path",
           channel.peer(), phase, p_.name_);
    }
    if (via_put_) return;  // put+flush completed before the BucketReady was sent
    auto it = posted_index_.find(slot);
    if (it == posted_index_.end() || it->second != bucket_index) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: bucket {} arrived in slot {}, which waits for {}",
           channel.peer(), phase, bucket_index, slot,
           it == posted_index_.end() ? std::string("nothing") : std::to_string(it->second));
    }
    ferry_request_t* request = posted_.at(slot);
    posted_.at(slot) = nullptr;
    posted_index_.erase(it);
    p_.finish(request, deadline, "recv_bucket of bucket " + std::to_string(bucket_index));
  }
  void abort(const std::string& reason) noexcept override { p_.abort(reason); }
  bool reads_peer_memory() const override {
    return p_.maps_peer_ && p_.device_memory_ && p_.slot_device_ >= 0;
  }
  const std::byte* map_peer(std::span<const std::uint8_t> key, std::uint64_t bytes,
                            Clock::time_point deadline) override {
    if (!reads_peer_memory()) ReceiverDataPath::map_peer(key, bytes, deadline);
    const ferry_blob_t blob = borrow_blob(key);
    const void* at = nullptr;
    throw_if_error(
        p_.api_->map_peer_memory(p_.transport_, p_.peer_, &blob, 0, bytes, to_ns(deadline), &at),
        p_.context("map_peer_memory"));
    if (at == nullptr && bytes > 0) {
      fail(FERRY_STATUS_INTERNAL, "transport '{}' map_peer_memory gave no address for {} bytes",
           p_.name_, bytes);
    }
    return static_cast<const std::byte*>(at);
  }
  void release_slots() noexcept override {
    for (auto*& r : posted_) {
      if (r != nullptr && p_.api_->request_free != nullptr) p_.api_->request_free(p_.transport_, r);
      r = nullptr;
    }
    posted_index_.clear();
    p_.release_slots();
  }

 private:
  PluginInstance p_;
  std::vector<ferry_request_t*> posted_;
  std::map<std::uint32_t, std::uint32_t> posted_index_;
  bool via_put_ = false;
};

class PluginSenderPath final : public SenderDataPath {
 public:
  PluginSenderPath(const registry::Registry& registry, const config::Config& config,
                   const std::string& name, std::uint64_t capacity, std::size_t slots, int device)
      : p_(registry, config, name, FERRY_ROLE_SENDER, capacity, slots, device), device_(device) {}
  std::string name() const override { return p_.name_; }
  std::size_t slot_count() const override { return p_.slots_; }
  std::span<std::byte> slot(std::uint32_t index) override { return p_.slot(index); }
  std::vector<std::uint8_t> address() override { return p_.address(); }
  void connect(std::span<const std::uint8_t> receiver_address,
               const std::vector<std::vector<std::uint8_t>>& slot_keys, bool rma_native,
               const std::string& peer, Clock::time_point deadline) override {
    p_.connect(receiver_address, peer, 0, deadline);
    keys_ = slot_keys;
    rma_ = false;
    bool have_keys = rma_native && p_.rma_native_ && !keys_.empty();
    for (const auto& k : keys_) have_keys = have_keys && !k.empty();
    if (have_keys && p_.device_transport_) {
      // A device transport writes the peer's memory natively (no emulated RMA to find out
      // about); not probing spares an import of slot 0, which direct delivery never writes.
      rma_ = true;
    } else if (have_keys) {
      // The plugin decides per peer whether put is worth it (UCX refuses put where it only
      // emulates RMA, e.g. over tcp): probe with a small put into the receiver's slot 0, which
      // holds no bucket yet.
      try {
        probe(deadline);
        rma_ = true;
      } catch (const Error& e) {
        // Refused (UNIMPLEMENTED), or a put the transport could not carry between these memories
        // (a GPU sender's device memory into a host receiver's slot, say): buckets go by tagged
        // sends. A dead peer, a deadline or an abort ends the session as it would anyway.
        const bool fatal = e.code() == FERRY_STATUS_PEER_FAILED || e.code() == FERRY_STATUS_TIMEOUT ||
                           e.code() == FERRY_STATUS_ABORTED;
        if (fatal || !p_.can_send_) throw;
        logger("sender")->info("{}: put probe: {}; moving buckets by tagged sends", peer,
                               e.what());
      }
    }
    if (!rma_ && !p_.can_send_) {
      fail(FERRY_STATUS_INCOMPATIBLE, "{}: '{}' can neither put into the receiver nor send",
           peer, p_.name_);
    }
    logger("sender")->info("{}: transport '{}' moves buckets by {}", peer, p_.name_,
                           rma_ ? "put + flush into the receiver's registered slots"
                                : "tagged send into receives the receiver posted");
  }
  bool uses_put() const override { return rma_; }
  bool delivers_pieces(ferry_memory_kind_t kind) const override {
    return rma_ && kind == FERRY_MEMORY_CUDA && p_.device_memory_;
  }
  // A plugin of ABI minor < 6 that fingerprints its puts computes xxh64-chunked-v1, not
  // FERRY_FINGERPRINT_ALGORITHM (plugin_api/CHANGELOG.md): its puts then carry no
  // fingerprint_out and the host fingerprints what they wrote itself.
  bool fingerprints_pieces() const override {
    return p_.device_memory_ && p_.rma_native_ &&
           (p_.caps_.flags & FERRY_TRANSPORT_CAP_PUT_FINGERPRINT) != 0 &&
           p_.plugin_->info().abi_minor >= kPutFingerprintMinor;
  }
  bool hashes_piece_chunks() const override {
    return fingerprints_pieces() &&
           (p_.caps_.flags & FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES) != 0 &&
           p_.plugin_->info().abi_minor >= kPutChunkHashesMinor;
  }
  void set_regions(std::vector<std::vector<std::uint8_t>> keys) override {
    if (!delivers_pieces(FERRY_MEMORY_CUDA)) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "transport '{}' cannot put CUDA tensors into the receiver",
           p_.name_);
    }
    regions_ = std::move(keys);
  }
  std::size_t prepare_regions(Clock::time_point deadline) override {
    if (regions_.empty() || p_.api_->prepare_puts == nullptr ||
        p_.plugin_->info().abi_minor < kPreparePutsMinor) {
      return 0;
    }
    std::vector<ferry_blob_t> keys;
    keys.reserve(regions_.size());
    for (std::size_t r = 0; r < regions_.size(); ++r) {
      keys.push_back(remote_key(0, static_cast<std::int64_t>(r), "prepare_puts"));
    }
    throw_if_error(p_.api_->prepare_puts(p_.transport_, p_.peer_, keys.data(), keys.size(),
                                         to_ns(deadline)),
                   p_.context("prepare_puts"));
    return keys.size();
  }

  // A put of 256 bytes into the receiver's slot 0, from memory of the kind this side puts from:
  // a small host buffer, or device memory on this side's GPU where the transport moves CUDA
  // memory (whether a put is native can depend on the memory: UCX maps GPU memory by cuda_ipc).
  void probe(Clock::time_point deadline) {
    const int device = p_.device_memory_ ? device_ : -1;
    if (!probe_buffer_) probe_buffer_.emplace(256, device);
    if (device < 0) std::fill(probe_buffer_->bytes().begin(), probe_buffer_->bytes().end(), std::byte{0});
    auto* memory = p_.local(probe_buffer_->bytes().data(), 256,
                            device >= 0 ? FERRY_MEMORY_CUDA : FERRY_MEMORY_HOST, device);
    const std::uint64_t bytes = std::min<std::uint64_t>(256, p_.capacity_);
    ferry_request_t* request = put(PluginInstance::whole(memory, bytes), 0, 0, deadline, "put probe");
    p_.finish(request, deadline, "put probe (put)");
    flush(deadline, "put probe");
  }

  // Starts one put of `local` to byte `offset` of the receiver's slot `slot`, or of its shared
  // region `region` when that is >= 0.
  ferry_request_t* put(const ferry_memory_range_t& local, std::uint32_t slot,
                       std::uint64_t offset, Clock::time_point deadline,
                       const std::string& phase, std::int64_t region = -1,
                       const TensorPiece* piece = nullptr) {
    ferry_blob_t key = remote_key(slot, region, phase);
    const ferry_put_args_t args = put_args(local, &key, offset, deadline, phase, piece);
    ferry_request_t* request = nullptr;
    throw_if_error(p_.api_->put(p_.transport_, p_.peer_, &args, &request), p_.context(phase));
    return request;
  }

  // The key of the receiver's slot `slot`, or of its shared region `region` when that is >= 0.
  ferry_blob_t remote_key(std::uint32_t slot, std::int64_t region, const std::string& phase) {
    if (region >= 0 && static_cast<std::uint64_t>(region) >= regions_.size()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: shared region {} of {}", phase, region,
           regions_.size());
    }
    return borrow_blob(region >= 0 ? regions_[static_cast<std::size_t>(region)] : keys_.at(slot));
  }

  ferry_put_args_t put_args(const ferry_memory_range_t& local, const ferry_blob_t* key,
                            std::uint64_t offset, Clock::time_point deadline,
                            const std::string& phase, const TensorPiece* piece) {
    ferry_put_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    args.local = local;
    args.remote_key = key;
    args.remote_offset = offset;
    args.deadline_ns = to_ns(deadline);
    if (piece != nullptr && piece->fingerprint != nullptr) {
      if (!fingerprints_pieces()) {
        fail(FERRY_STATUS_INTERNAL, "{}: transport '{}' cannot fingerprint its puts", phase,
             p_.name_);
      }
      args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, fingerprint_out);
      args.fingerprint_out = piece->fingerprint;
      if (piece->chunk_hashes != nullptr) {
        if (!hashes_piece_chunks()) {
          fail(FERRY_STATUS_INTERNAL, "{}: transport '{}' cannot hash its puts' chunks", phase,
               p_.name_);
        }
        args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, chunk_index_base);
        args.chunk_hashes_out = piece->chunk_hashes;
        args.chunk_index_base = piece->chunk_base;
      }
    }
    return args;
  }

  // Every piece's put in one put_many call (FERRY_TRANSPORT_CAP_PUT_DEFERRED transports that
  // have it): thousands of tensors per flush cost one call, not one each.
  void put_many(const std::vector<TensorPiece>& pieces,
                const std::vector<ferry_memory_range_t>& spans, std::uint32_t slot,
                Clock::time_point deadline, const std::string& phase) {
    // One blob per key: the plugin decodes a key once per run of puts that share it.
    std::vector<ferry_blob_t> region_keys;
    region_keys.reserve(regions_.size());
    for (std::size_t r = 0; r < regions_.size(); ++r) {
      region_keys.push_back(remote_key(slot, static_cast<std::int64_t>(r), phase));
    }
    const ferry_blob_t slot_key = slot < keys_.size() ? remote_key(slot, -1, phase) : ferry_blob_t{};
    std::vector<ferry_put_args_t> args;
    args.reserve(pieces.size());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const auto& piece = pieces[i];
      if (piece.size == 0) continue;  // (the caller knows the fingerprint of nothing)
      if (piece.region >= 0 && static_cast<std::uint64_t>(piece.region) >= regions_.size()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: shared region {} of {}", phase, piece.region,
             regions_.size());
      }
      const ferry_blob_t* key =
          piece.region >= 0 ? &region_keys[static_cast<std::size_t>(piece.region)] : &slot_key;
      args.push_back(put_args(spans[i], key, piece.offset, deadline, phase, &piece));
    }
    std::vector<const ferry_put_args_t*> pointers;
    pointers.reserve(args.size());
    for (const auto& a : args) pointers.push_back(&a);
    throw_if_error(
        p_.api_->put_many(p_.transport_, p_.peer_, pointers.data(), pointers.size()),
        p_.context(phase));
  }

  void flush(Clock::time_point deadline, const std::string& phase) {
    ferry_request_t* request = nullptr;
    throw_if_error(p_.api_->flush(p_.transport_, p_.peer_, to_ns(deadline), &request),
                   p_.context(phase));
    p_.finish(request, deadline, phase + " (flush)");
  }

  void put_and_flush(std::uint32_t slot, std::uint64_t bytes, Clock::time_point deadline,
                     const std::string& phase) {
    ferry_request_t* request = put(p_.range(slot, bytes), slot, 0, deadline, phase);
    p_.finish(request, deadline, phase + " (put)");
    flush(deadline, phase);
  }

  // Every put of a bucket is enqueued, then one flush: the copies run back to back on the
  // plugin's stream. The requests are freed once the flush completed, or on failure.
  void start_pieces(std::uint32_t slot, std::uint32_t /*bucket_index*/,
                    std::vector<TensorPiece> pieces, Clock::time_point deadline,
                    const std::string& phase, bool launch = true) override {
    if (started_.size() >= kMaxStartedPieces) {
      fail(FERRY_STATUS_INTERNAL, "{}: started before '{}' finished", phase,
           started_.front().phase);
    }
    Started st;
    st.phase = phase;
    st.count = pieces.size();
    const auto start = Clock::now();
    try {
      st.requests.reserve(pieces.size());
      const auto t0 = Clock::now();
      const auto spans = registered_spans(pieces);
      st.register_s += std::chrono::duration<double>(Clock::now() - t0).count();
      if (defers_pieces() && p_.api_->put_many != nullptr) {
        put_many(pieces, spans, slot, deadline, phase);
      } else {
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          const auto& piece = pieces[i];
          if (piece.size == 0) continue;  // (the caller knows the fingerprint of nothing)
          st.requests.push_back(
              put(spans[i], slot, piece.offset, deadline, phase, piece.region, &piece));
        }
      }
      if (launch) issue_flush(st, deadline, phase);
    } catch (...) {
      release(st);
      throw;
    }
    st.queue_s = std::chrono::duration<double>(Clock::now() - start).count();
    started_.push_back(std::move(st));
  }
  // A transport whose puts write nothing before their flush (FERRY_TRANSPORT_CAP_PUT_DEFERRED)
  // may be given them before the receiver is ready.
  bool defers_pieces() const override {
    return rma_ && (p_.caps_.flags & FERRY_TRANSPORT_CAP_PUT_DEFERRED) != 0;
  }
  void launch_pieces(Clock::time_point deadline, const std::string& phase) override {
    for (auto& st : started_) {
      if (st.flush == nullptr) {
        issue_flush(st, deadline, phase);
        return;
      }
    }
    fail(FERRY_STATUS_INTERNAL, "{}: no queued pieces to launch", phase);
  }
  void finish_pieces(Clock::time_point deadline, const std::string& phase) override {
    if (started_.empty()) return;
    if (started_.front().flush == nullptr) {
      fail(FERRY_STATUS_INTERNAL, "{}: finished before it was launched", phase);
    }
    Started st = std::move(started_.front());
    started_.pop_front();
    const auto start = Clock::now();
    ferry_request_t* flush = std::exchange(st.flush, nullptr);
    try {
      p_.finish(flush, deadline, phase + " (flush)");  // frees the flush request
    } catch (...) {
      release(st);
      throw;
    }
    release(st);
    logger("sender")->debug(
        "{}: {} pieces: queued in {:.3f} ms (registering {:.3f} ms, flush issue {:.3f} ms), "
        "then flushed in {:.3f} ms",
        phase, st.count, st.queue_s * 1e3, st.register_s * 1e3, st.flush_issue_s * 1e3,
        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  void deliver_pieces(std::uint32_t slot, std::uint32_t bucket_index,
                      std::span<const TensorPiece> pieces, Clock::time_point deadline,
                      const std::string& phase) override {
    start_pieces(slot, bucket_index, std::vector<TensorPiece>(pieces.begin(), pieces.end()),
                 deadline, phase);
    finish_pieces(deadline, phase);
  }
  void deliver(std::uint32_t slot, std::uint32_t bucket_index, std::uint64_t bytes,
               Clock::time_point deadline, const std::string& phase) override {
    if (rma_) {
      put_and_flush(slot, bytes, deadline, phase);
    } else {
      auto io = p_.bucket_io(slot, bucket_index, bytes, deadline);
      ferry_request_t* request = nullptr;
      throw_if_error(p_.api_->send_bucket(p_.transport_, p_.peer_, &io, &request),
                     p_.context(phase));
      p_.finish(request, deadline, phase + " (send)");
    }
  }
  void abort(const std::string& reason) noexcept override { p_.abort(reason); }
  void end_push() noexcept override {
    p_.forget_local();
    // Lent memory stays while the next push lends it again.
    p_.forget_lent_before(push_);
    ++push_;
  }
  bool lends_tensors() const override { return p_.maps_peer_ && p_.device_memory_; }
  std::vector<std::uint8_t> lend(const void* data, std::uint64_t bytes) override {
    if (!lends_tensors()) return SenderDataPath::lend(data, bytes);
    return p_.lend(data, bytes, device_, push_);
  }
  void check_lent() override {
    if (lends_tensors()) p_.check_lent();
  }
  ~PluginSenderPath() override {
    for (auto& st : started_) release(st);
  }

 private:
  // A bucket's puts and flush, queued and not yet waited for (start_pieces).
  struct Started {
    std::vector<ferry_request_t*> requests;
    ferry_request_t* flush = nullptr;
    std::string phase;
    std::size_t count = 0;
    double queue_s = 0;        // registrations, puts and the flush call
    double register_s = 0;     // of which registering the pieces' memory
    double flush_issue_s = 0;  // of which the flush call (it enqueues the queued copies)
  };
  void release(Started& st) noexcept {
    if (p_.api_->request_free == nullptr) return;
    for (auto* r : st.requests) {
      if (r != nullptr) p_.api_->request_free(p_.transport_, r);
    }
    st.requests.clear();
    if (st.flush != nullptr) p_.api_->request_free(p_.transport_, st.flush);
    st.flush = nullptr;
  }
  // The flush that launches st's queued puts.
  void issue_flush(Started& st, Clock::time_point deadline, const std::string& phase) {
    const auto t1 = Clock::now();
    throw_if_error(p_.api_->flush(p_.transport_, p_.peer_, to_ns(deadline), &st.flush),
                   p_.context(phase));
    st.flush_issue_s = std::chrono::duration<double>(Clock::now() - t1).count();
  }

  // The local range of each piece (empty pieces: none). Pieces in device memory that lie close
  // together (a trainer's parameters sit in a few large allocations) share one registration:
  // a device transport's registration of a put's local side only checks the pointer, ~1 us
  // each, which thousands of tensors per push made a millisecond per 1024 tensors.
  std::vector<ferry_memory_range_t> registered_spans(const std::vector<TensorPiece>& pieces) {
    constexpr std::uint64_t kMaxGap = 4096;  // bytes between pieces that one span may cover
    std::vector<std::size_t> order;
    order.reserve(pieces.size());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].size > 0) order.push_back(i);
    }
    auto address = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(pieces[i].data); };
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return address(a) < address(b); });
    std::vector<ferry_memory_range_t> out(pieces.size(), ferry_memory_range_t{});
    for (std::size_t first = 0; first < order.size();) {
      const TensorPiece& head = pieces[order[first]];
      const bool device = head.kind == FERRY_MEMORY_CUDA;
      const std::uintptr_t begin = address(order[first]);
      std::uintptr_t end = begin + head.size;
      std::size_t last = first + 1;
      while (device && last < order.size()) {
        const TensorPiece& next = pieces[order[last]];
        const std::uintptr_t at = address(order[last]);
        if (next.kind != head.kind || next.device != head.device || at > end + kMaxGap) break;
        end = std::max<std::uintptr_t>(end, at + next.size);
        ++last;
      }
      auto* memory = p_.local(head.data, end - begin, head.kind, device ? head.device : device_);
      for (std::size_t k = first; k < last; ++k) {
        auto& r = out[order[k]];
        r = PluginInstance::whole(memory, pieces[order[k]].size);
        r.offset = address(order[k]) - begin;
      }
      first = last;
    }
    return out;
  }

  PluginInstance p_;
  std::deque<Started> started_;  // oldest first; at most kMaxStartedPieces
  std::uint64_t push_ = 0;       // pushes ended so far (end_push), to sweep lent memory
  int device_ = -1;
  bool rma_ = false;
  std::vector<std::vector<std::uint8_t>> keys_;
  std::vector<std::vector<std::uint8_t>> regions_;  // the receiver's shared regions (direct)
  std::optional<StagingSlot> probe_buffer_;
};

}  // namespace

std::unique_ptr<ReceiverDataPath> make_plugin_receiver_path(const registry::Registry& registry,
                                                            const config::Config& config,
                                                            const std::string& name,
                                                            std::uint64_t capacity,
                                                            std::size_t slots, int device) {
  return std::make_unique<PluginReceiverPath>(registry, config, name, capacity, slots, device);
}

std::unique_ptr<SenderDataPath> make_plugin_sender_path(const registry::Registry& registry,
                                                        const config::Config& config,
                                                        const std::string& name,
                                                        std::uint64_t capacity, std::size_t slots,
                                                        int device) {
  return std::make_unique<PluginSenderPath>(registry, config, name, capacity, slots, device);
}

}  // namespace ferry::session
