// cuda_ipc/cuda_ipc_transport.cpp: registrations, imports, copies and requests of one CUDA IPC
// transport instance (see cuda_ipc_transport.hpp).
#include "cuda_ipc_transport.hpp"

#include "batch_copy.hpp"

#include <ferry/sdk/cuda_scratch.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/xxh64.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

namespace ferry::cuda_ipc {

Options parse_options(const ferry_option_t* options, std::size_t count) {
  Options out;
  const char* tmp = std::getenv("TMPDIR");
  out.socket_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  for (std::size_t i = 0; i < count; ++i) {
    const std::string key = options[i].key != nullptr ? options[i].key : "";
    const std::string value = options[i].value != nullptr ? options[i].value : "";
    if (key == "socket_dir") {
      if (value.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc: socket_dir is empty");
      out.socket_dir = value;
    } else if (key == "copy_lanes") {
      if (value != "1" && value != "2") {
        fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc: copy_lanes is '{}', expected 1 or 2", value);
      }
      out.copy_lanes = value == "1" ? 1 : 2;
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "cuda_ipc: unknown option '{}' (known: socket_dir, copy_lanes)", key);
    }
  }
  return out;
}

LegacyOpening::~LegacyOpening() {
  if (base == nullptr) return;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (previous != device) (void)cudaSetDevice(device);
  (void)cudaIpcCloseMemHandle(base);
  (void)cudaGetLastError();
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
}

namespace {

// Page-locked arrays for fingerprint read-backs, shared by every instance of the process and
// kept for its life (the library is pinned in memory): a session makes a new instance, and
// cudaMallocHost costs about a millisecond, more than a bucket's copies.
struct PinnedPrints {
  std::mutex mutex;
  std::vector<std::pair<std::uint64_t*, std::size_t>> free;  // (array, entries)
};
PinnedPrints& pinned_prints() {
  static PinnedPrints* pool = new PinnedPrints;  // never destroyed: used until the process ends
  return *pool;
}

// An array of at least `n` entries: one that fits from the pool, else a new one.
std::pair<std::uint64_t*, std::size_t> take_pinned_prints(std::size_t n) {
  auto& pool = pinned_prints();
  {
    std::lock_guard lock(pool.mutex);
    auto fit = std::find_if(pool.free.begin(), pool.free.end(),
                            [&](const auto& a) { return a.second >= n; });
    if (fit != pool.free.end()) {
      const auto out = *fit;
      pool.free.erase(fit);
      return out;
    }
  }
  const std::size_t entries = std::max<std::size_t>(n, 1024);
  void* host = nullptr;
  const cudaError_t err =
      cudaHostAlloc(&host, entries * sizeof(std::uint64_t), cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FERRY_STATUS_OUT_OF_MEMORY,
         "cuda_ipc: cudaHostAlloc of {} bytes (fingerprint "
         "read-back): {}",
         entries * sizeof(std::uint64_t), cudaGetErrorString(err));
  }
  return {static_cast<std::uint64_t*>(host), entries};
}

void give_pinned_prints(std::uint64_t* array, std::size_t entries) noexcept {
  if (array == nullptr) return;
  auto& pool = pinned_prints();
  std::lock_guard lock(pool.mutex);
  try {
    pool.free.emplace_back(array, entries);
  } catch (...) {
    // Out of memory for the list: the array is dropped (still page-locked, a few KiB).
  }
}

// One worker thread for the whole process (started on first use, kept for its life, like the
// pinned library): work that should not wait for its caller, without a thread per session,
// which would add its stack to the process's mappings whenever sessions overlap.
class BackgroundWorker {
 public:
  static BackgroundWorker& get() {
    static BackgroundWorker* worker = new BackgroundWorker;  // never destroyed
    return *worker;
  }
  void post(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool started_ = false;
};

// Runs `work` on the background worker; its result (or exception) comes through the future.
template <typename Work>
auto background(Work work) -> std::future<decltype(work())> {
  auto task = std::make_shared<std::packaged_task<decltype(work())()>>(std::move(work));
  auto result = task->get_future();
  BackgroundWorker::get().post([task] { (*task)(); });
  return result;
}

// A deadline of 0 or less means the caller gave none: still never wait forever.
constexpr std::int64_t kDefaultWaitNs = 300'000'000'000;
std::int64_t effective(std::int64_t deadline_ns) {
  return deadline_ns > 0 ? deadline_ns : monotonic_ns() + kDefaultWaitNs;
}

const char* kind_name(ferry_request::Kind kind) {
  switch (kind) {
    case ferry_request::Kind::Flush:
      return "flush";
    case ferry_request::Kind::Send:
      return "send_bucket";
    case ferry_request::Kind::Recv:
      return "recv_bucket";
  }
  return "request";
}

}  // namespace
}  // namespace ferry::cuda_ipc

using namespace ferry::cuda_ipc;
using ferry::Error;
using ferry::fail;

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args, Options options)
    : role_(args.role),
      device_(args.device),
      nonce_(random_nonce()),
      copy_lanes_(options.copy_lanes) {
  endpoint_ = std::make_unique<Endpoint>(options.socket_dir, nonce_,
                                         [this](std::uint64_t id) { return answer_import(id); });
}

ferry_transport::~ferry_transport() {
  if (cuda_ready_) {
    try {
      ferry::cuda_ipc::DeviceScope scope(device_);
      (void)cudaStreamSynchronize(stream_);
    } catch (const Error&) {
      // The device is gone; nothing is in flight on it any more.
    }
  }
  std::set<ferry_peer*> peers;
  {
    std::lock_guard lock(state_mutex_);
    peers = peers_;
  }
  for (auto* p : peers) disconnect(p);
  {
    std::lock_guard lock(state_mutex_);
    for (auto* r : requests_) {
      if (r->event != nullptr) return_event(r->event);
      delete r;
    }
    requests_.clear();
  }
  endpoint_.reset();  // no import can be answered past this point
  std::map<std::uint64_t, ferry_memory*> memory;
  {
    std::lock_guard lock(memory_mutex_);
    memory = memory_;
  }
  for (auto& [id, m] : memory) deregister_memory(m);
  if (cuda_ready_) {
    try {
      ferry::cuda_ipc::DeviceScope scope(device_);
      for (auto e : free_events_) (void)cudaEventDestroy(e);
      for (auto& b : print_batches_) {
        give_pinned_prints(b.host, b.capacity);
        if (b.began != nullptr) (void)cudaEventDestroy(b.began);
        if (b.ended != nullptr) (void)cudaEventDestroy(b.ended);
      }
      for (auto e : free_timing_events_) (void)cudaEventDestroy(e);
      if (previous_began_ != nullptr) (void)cudaEventDestroy(previous_began_);
      for (unsigned l = 0; l < 2; ++l) {
        if (lane_done_[l] != nullptr) (void)cudaEventDestroy(lane_done_[l]);
        if (lanes_[l] != nullptr) (void)cudaStreamDestroy(lanes_[l]);
      }
      if (stream_tail_ != nullptr) (void)cudaEventDestroy(stream_tail_);
      (void)cudaStreamDestroy(stream_);
    } catch (const Error&) {
      // The device cannot be made current any more: the process is going down with it.
    }
  }
}

void ferry_transport::ensure_cuda() {
  std::lock_guard lock(cuda_mutex_);
  if (cuda_ready_) return;
  (void)Driver::get();
  if (device_ < 0) check_rt(cudaGetDevice(&device_), "cudaGetDevice");
  DeviceScope scope(device_);
  check_rt(cudaFree(nullptr), "initializing the CUDA context");
  check_rt(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_rt(cudaEventCreateWithFlags(&stream_tail_, cudaEventDisableTiming), "cudaEventCreate");
  for (unsigned l = 0; l < copy_lanes_; ++l) {
    check_rt(cudaStreamCreateWithFlags(&lanes_[l], cudaStreamNonBlocking), "cudaStreamCreate");
    check_rt(cudaEventCreateWithFlags(&lane_done_[l], cudaEventDisableTiming), "cudaEventCreate");
  }
  cuda_ready_ = true;
}

cudaEvent_t ferry_transport::take_event(bool timing) {
  auto& pool = timing ? free_timing_events_ : free_events_;
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_rt(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
           "cudaEventCreate");
  return e;
}

void ferry_transport::return_event(cudaEvent_t event) noexcept {
  try {
    free_events_.push_back(event);
  } catch (...) {
    (void)cudaEventDestroy(event);
  }
}

void ferry_transport::check_not_aborted() {
  std::lock_guard lock(state_mutex_);
  if (!aborted_.empty()) fail(FERRY_STATUS_ABORTED, "cuda_ipc: aborted: {}", aborted_);
}

std::vector<std::uint8_t> ferry_transport::address() const {
  return encode_address(endpoint_->address());
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  check_not_aborted();
  if (args.num_remote != 1 || args.remote_addresses == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "cuda_ipc connect: point-to-point only: expected 1 remote address, got {}",
         args.num_remote);
  }
  const ferry_blob_t& blob = args.remote_addresses[0];
  if (blob.data == nullptr && blob.size > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc connect: remote address data is NULL");
  }
  const Address remote = decode_address({blob.data, blob.size});
  const std::string name = args.peer_name != nullptr && *args.peer_name != '\0'
                               ? std::string(args.peer_name)
                               : fmt::format("peer pid {}", remote.pid);
  auto peer = std::make_unique<ferry_peer>();
  peer->link = endpoint_->connect(remote, name, effective(args.deadline_ns));
  std::lock_guard lock(state_mutex_);
  peers_.insert(peer.get());
  return peer.release();
}

void ferry_transport::disconnect(ferry_peer* peer) noexcept {
  if (peer == nullptr) return;
  {
    std::lock_guard lock(state_mutex_);
    if (peers_.erase(peer) == 0) return;
    for (auto* r : requests_) {
      if (r->peer != peer) continue;
      r->peer = nullptr;
      if (!r->done) {
        r->done = true;
        r->code = FERRY_STATUS_FAILED_PRECONDITION;
        r->message = "cuda_ipc: the peer of this request was disconnected";
      }
    }
  }
  {
    // Queued puts into this peer's memory are dropped: it is about to be unmapped.
    std::lock_guard lock(cuda_mutex_);
    std::erase_if(pending_, [&](const PendingCopy& c) { return c.peer == peer; });
  }
  if (cuda_ready_) {
    try {
      DeviceScope scope(device_);
      (void)cudaStreamSynchronize(stream_);  // no copy may still target what we unmap
      std::lock_guard lock(peer->mutex);
      for (auto& [id, imported] : peer->imports) unmap(imported);
      peer->imports.clear();
    } catch (const Error&) {
      // Device lost: the mappings die with the context.
    }
  }
  delete peer;
}

// Before a new import: the imports of registrations the peer revoked go (peer->mutex held). A
// peer revokes a registration between updates (its memory released, or its tensors moved or
// freed), so nothing reads or writes it any more; its import here would keep the peer's old
// memory alive, and a legacy opening of an allocation the peer freed would stand in for the new
// allocation at the same address. Copies this transport queued finish first.
void ferry_transport::drop_revoked_imports(ferry_peer& peer) {
  const auto revoked = peer.link->take_newly_revoked();
  bool synced = false;
  for (const std::uint64_t id : revoked) {
    auto it = peer.imports.find(id);
    if (it == peer.imports.end()) continue;
    if (!synced && it->second.va != 0) {
      check_rt(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (before an unmap)");
      synced = true;
    }
    unmap(it->second);
    peer.imports.erase(it);
  }
}

void ferry_transport::unmap(Imported& imported) noexcept {
  if (imported.va != 0) {
    const Driver& d = Driver::get();
    for (const auto& c : imported.chunks) {
      if (c.mapped) (void)d.unmap(imported.va + c.offset, c.size);
    }
    imported.chunks.clear();  // closes the fds of chunks never mapped
    (void)d.address_free(imported.va, imported.span);
    imported.va = 0;
  }
  imported.legacy.reset();  // the last user closes the cudaIpc opening
}

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.base == nullptr || desc.size == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc register_memory: empty range (base {}, {} bytes)",
         desc.base, desc.size);
  }
  if (reinterpret_cast<std::uintptr_t>(desc.base) + desc.size <
      reinterpret_cast<std::uintptr_t>(desc.base)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc register_memory: range wraps the address space");
  }
  auto m = std::make_unique<ferry_memory>();
  m->base = static_cast<std::uint8_t*>(desc.base);
  m->size = desc.size;
  m->kind = desc.kind;
  if (desc.kind != FERRY_MEMORY_CUDA) {
    if (desc.kind != FERRY_MEMORY_HOST && desc.kind != FERRY_MEMORY_PINNED) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc register_memory: unknown memory kind {}",
           static_cast<int>(desc.kind));
    }
    m->not_shareable = fmt::format(
        "memory at {} is host memory: it can be the local side of a put, but only CUDA device "
        "memory can be shared over cuda_ipc",
        desc.base);
  } else {
    ensure_cuda();
    DeviceScope scope(device_);
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, desc.base) == cudaSuccess) {
      if (attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeUnregistered) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "cuda_ipc register_memory: {} was declared CUDA memory but is host memory", desc.base);
      }
      if (attr.type == cudaMemoryTypeDevice && attr.device != device_) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "cuda_ipc register_memory: {} lies on CUDA device {}, this transport uses device {}",
             desc.base, attr.device, device_);
      }
    } else {
      (void)cudaGetLastError();
    }
    // How it is shared (VMM chunks or a legacy allocation) is found out on first need
    // (pack_key, a peer's import, send_bucket): memory that is only the local side of puts
    // (a sender's tensors, thousands per update) costs no driver calls beyond the check above.
    m->resolved = false;
  }
  std::lock_guard lock(memory_mutex_);
  m->id = next_memory_id_++;
  memory_[m->id] = m.get();
  return m.release();
}

void ferry_transport::resolve_share(ferry_memory& m) {
  std::lock_guard share_lock(share_mutex_);
  if (m.resolved) return;
  DeviceScope scope(device_);
  const Driver& d = Driver::get();
  const auto base = reinterpret_cast<CUdeviceptr>(m.base);
  const CUdeviceptr end = base + m.size;
  CUmemGenericAllocationHandle handle = 0;
  if (d.retain(&handle, static_cast<void*>(m.base)) == CUDA_SUCCESS) {
    // VMM memory (ferry's CUDA store): one retained handle per mapped chunk in the range.
    m.share = ShareKind::Vmm;
    try {
      CUdeviceptr at = base;
      CUdeviceptr span_start = 0;
      bool first = true;
      while (at < end) {
        if (!first) {
          check_cu(d.retain(&handle, reinterpret_cast<void*>(at)),
                   "cuMemRetainAllocationHandle (a hole in the registered range?)");
        }
        m.chunks.push_back({handle, 0, 0});
        CUdeviceptr segment = 0;
        std::size_t segment_size = 0;
        check_cu(d.address_range(&segment, &segment_size, at), "cuMemGetAddressRange");
        if (first) span_start = segment;
        first = false;
        m.chunks.back().offset = segment - span_start;
        m.chunks.back().size = segment_size;
        CUmemAllocationProp prop{};
        check_cu(d.properties(&prop, handle), "cuMemGetAllocationPropertiesFromHandle");
        if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 &&
            m.not_shareable.empty()) {
          m.not_shareable = fmt::format(
              "the VMM allocation at {:#x} was created without POSIX file descriptor export "
              "(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); create the store with exportable "
              "chunks",
              segment);
        }
        at = segment + segment_size;
      }
      m.base_offset = base - span_start;
    } catch (...) {
      for (auto& c : m.chunks) (void)d.release(c.handle);
      m.chunks.clear();
      throw;
    }
  } else {
    // Not VMM: a cudaMalloc allocation (e.g. PyTorch's caching allocator): legacy cudaIpc.
    m.share = ShareKind::Legacy;
    CUdeviceptr allocation = 0;
    std::size_t allocation_size = 0;
    check_cu(d.address_range(&allocation, &allocation_size, base),
             "cuMemGetAddressRange (is the range CUDA device memory?)");
    if (end > allocation + allocation_size) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "cuda_ipc register_memory: [{}, +{}) runs past the end of its CUDA allocation "
           "({:#x}, {} bytes)",
           static_cast<void*>(m.base), m.size, allocation, allocation_size);
    }
    m.base_offset = base - allocation;
    const cudaError_t err = cudaIpcGetMemHandle(&m.ipc, reinterpret_cast<void*>(allocation));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      m.not_shareable = fmt::format("cudaIpcGetMemHandle refused the allocation at {:#x}: {}",
                                    allocation, cudaGetErrorName(err));
    }
  }
  m.resolved = true;
}

std::vector<std::uint8_t> ferry_transport::pack_key(ferry_memory* memory) {
  {
    std::lock_guard lock(memory_mutex_);
    auto it = memory == nullptr ? memory_.end() : memory_.find(memory->id);
    if (it == memory_.end() || it->second != memory) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc pack_key: memory is not registered here");
    }
  }
  resolve_share(*memory);
  if (!memory->not_shareable.empty()) {
    fail(FERRY_STATUS_UNIMPLEMENTED, "cuda_ipc pack_key: {}", memory->not_shareable);
  }
  memory->offered = true;
  if (memory->share == ShareKind::Vmm) {
    // The peer that gets this key imports the memory next: its fds are made meanwhile.
    std::lock_guard lock(memory_mutex_);
    if (!memory->early_export.valid()) {
      try {
        memory->early_export = background([this, memory] { return export_chunks(*memory); });
      } catch (const std::system_error&) {
        // No thread to be had: the import answer exports them.
      }
    }
  }
  return encode_key(Key{nonce_, memory->id, memory->base_offset, memory->size, memory->share});
}

void ferry_transport::deregister_memory(ferry_memory* memory) noexcept {
  if (memory == nullptr) return;
  {
    std::lock_guard lock(memory_mutex_);
    auto it = memory_.find(memory->id);
    if (it == memory_.end() || it->second != memory) return;
    memory_.erase(it);
  }
  if (memory->offered) {
    // Peers that imported it keep their mapping (and so the old memory) until they disconnect;
    // this tells them to refuse the key from now on. Best effort: a peer that is gone needs
    // no telling.
    std::lock_guard lock(state_mutex_);
    for (auto* p : peers_) {
      try {
        p->link->send(Frame{MessageType::Revoked, PayloadWriter().u64(memory->id).take(), {}});
      } catch (const std::exception&) {
        // The peer is gone or its socket broke: nothing can use the key any more.
      }
    }
  }
  if (memory->early_export.valid()) {
    // It reads the chunks' handles: done before they go (its fds, never sent, close here).
    try {
      (void)memory->early_export.get();
    } catch (const std::exception&) {
    }
  }
  std::lock_guard share_lock(share_mutex_);
  if (!memory->chunks.empty()) {
    try {
      const Driver& d = Driver::get();
      for (auto& c : memory->chunks) (void)d.release(c.handle);
    } catch (const Error&) {
      // No driver: nothing was retained.
    }
  }
  delete memory;
}

Endpoint::ImportAnswer ferry_transport::answer_import(std::uint64_t memory_id) {
  std::lock_guard lock(memory_mutex_);
  auto it = memory_.find(memory_id);
  if (it == memory_.end()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "stale key: memory {} is not registered (deregistered since the key was packed)",
         memory_id);
  }
  ferry_memory& m = *it->second;
  resolve_share(m);
  if (!m.not_shareable.empty()) fail(FERRY_STATUS_FAILED_PRECONDITION, "{}", m.not_shareable);
  Endpoint::ImportAnswer answer;
  PayloadWriter w;
  w.u8(static_cast<std::uint8_t>(m.share)).u64(m.size).u64(m.base_offset);
  if (m.share == ShareKind::Vmm) {
    std::vector<UniqueFd> fds;
    if (m.early_export.valid()) {
      try {
        fds = m.early_export.get();
      } catch (const std::exception&) {
        fds.clear();  // exported again below, where the error recurs with its message
      }
    }
    if (fds.size() != m.chunks.size()) fds = export_chunks(m);
    w.u32(static_cast<std::uint32_t>(m.chunks.size()));
    for (std::size_t i = 0; i < m.chunks.size(); ++i) {
      answer.fds.push_back(std::move(fds[i]));
      w.u64(m.chunks[i].offset).u64(m.chunks[i].size);
    }
  } else {
    // The allocation's address here names it for the importer's cache (one opening per
    // allocation however many registrations lie in it).
    w.bytes({reinterpret_cast<const std::uint8_t*>(&m.ipc), sizeof m.ipc})
        .u64(reinterpret_cast<std::uintptr_t>(m.base) - m.base_offset);
  }
  answer.body = w.take();
  return answer;
}

std::vector<UniqueFd> ferry_transport::export_chunks(const ferry_memory& m) {
  DeviceScope scope(device_);
  const Driver& d = Driver::get();
  std::vector<UniqueFd> fds;
  fds.reserve(m.chunks.size());
  for (const auto& c : m.chunks) {
    int fd = -1;
    check_cu(d.export_handle(&fd, c.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             "cuMemExportToShareableHandle");
    fds.emplace_back(fd);
  }
  return fds;
}

Imported ferry_transport::reserve_vmm(PayloadReader& body, std::vector<UniqueFd>& fds,
                                      const std::string& peer) {
  const Driver& d = Driver::get();
  const std::uint32_t count = body.u32();
  if (count == 0 || count != fds.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent {} chunk descriptions and {} fds", peer,
         count, fds.size());
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks;
  std::uint64_t span = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint64_t offset = body.u64();
    const std::uint64_t size = body.u64();
    if (offset != span || size == 0) {
      fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent non-contiguous chunks", peer);
    }
    auto next = ferry::checked_add(span, size);
    if (!next) fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent chunks that overflow", peer);
    span = *next;
    chunks.emplace_back(offset, size);
  }
  Imported out;
  out.span = span;
  check_cu(d.address_reserve(&out.va, span, 0, 0, 0), "cuMemAddressReserve for an import");
  out.chunks.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    Imported::Chunk c;
    c.offset = chunks[i].first;
    c.size = chunks[i].second;
    c.fd = std::move(fds[i]);
    out.chunks.push_back(std::move(c));
  }
  return out;
}

std::uint8_t* ferry_transport::mapped(ferry_peer* peer, Imported& imported, std::uint64_t offset,
                                      std::uint64_t bytes) {
  std::uint8_t* const at = imported.base + offset;
  if (imported.va == 0 || bytes == 0) return at;
  const std::uint64_t begin =
      static_cast<std::uint64_t>(at - reinterpret_cast<std::uint8_t*>(imported.va));
  const std::uint64_t end = begin + bytes;
  std::lock_guard lock(peer->mutex);
  bool all = true;
  for (auto& c : imported.chunks) {
    if (!c.mapped && c.offset < end && c.offset + c.size > begin) map_chunk_locked(imported, c);
    all = all && c.mapped;
  }
  imported.all_mapped = all;
  return at;
}

void ferry_transport::map_chunk_locked(Imported& imported, Imported::Chunk& c) {
  const Driver& d = Driver::get();
  DeviceScope scope(device_);
  CUmemGenericAllocationHandle handle = 0;
  check_cu(d.import_handle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(c.fd.get())),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           "cuMemImportFromShareableHandle");
  const CUresult mapped_result = d.map(imported.va + c.offset, c.size, 0, handle, 0);
  (void)d.release(handle);  // the mapping keeps the memory alive until cuMemUnmap
  check_cu(mapped_result, "cuMemMap of an imported chunk");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult access_result = d.set_access(imported.va + c.offset, c.size, &access, 1);
  if (access_result != CUDA_SUCCESS) (void)d.unmap(imported.va + c.offset, c.size);
  check_cu(access_result, "cuMemSetAccess on an import");
  c.mapped = true;
  c.fd.reset();  // the mapping holds the allocation now
}

Imported& ferry_transport::import(ferry_peer* peer, std::uint64_t memory_id,
                                  std::optional<ShareKind> expected, std::int64_t deadline_ns) {
  std::lock_guard lock(peer->mutex);
  if (auto it = peer->imports.find(memory_id); it != peer->imports.end()) return it->second;
  ensure_cuda();
  DeviceScope scope(device_);
  drop_revoked_imports(*peer);
  const std::string& name = peer->link->name();
  const std::int64_t asked_ns = monotonic_ns();
  Frame reply = peer->link->import(peer->link->remote().nonce, memory_id, deadline_ns);
  const std::int64_t answered_ns = monotonic_ns();
  std::vector<UniqueFd> fds;
  for (int fd : reply.fds) fds.emplace_back(fd);
  PayloadReader body(reply.payload, "import reply");
  const auto kind = static_cast<ShareKind>(body.u8());
  const std::uint64_t size = body.u64();
  const std::uint64_t base_offset = body.u64();
  if (expected && kind != *expected) {
    fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} shares memory {} as kind {}, its key said {}",
         name, memory_id, static_cast<int>(kind), static_cast<int>(*expected));
  }
  Imported imported;
  if (kind == ShareKind::Vmm) {
    imported = reserve_vmm(body, fds, name);
    if (base_offset > imported.span || size > imported.span - base_offset) {
      unmap(imported);
      fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} registered {} bytes past its chunks", name,
           size);
    }
    imported.base = reinterpret_cast<std::uint8_t*>(imported.va) + base_offset;
  } else if (kind == ShareKind::Legacy) {
    const auto handle_bytes = body.bytes();
    cudaIpcMemHandle_t handle{};
    if (handle_bytes.size() != sizeof handle || !fds.empty()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent a malformed legacy handle", name);
    }
    std::memcpy(&handle, handle_bytes.data(), sizeof handle);
    const std::uint64_t allocation = body.u64();
    std::lock_guard legacy_lock(legacy_mutex_);
    std::erase_if(legacy_, [](const auto& entry) { return entry.second.expired(); });
    // One opening per allocation and handle: an allocation the peer freed and one it made
    // since at the same address differ in their handles.
    std::string name_of = fmt::format("{:016x}:{:x}:", peer->link->remote().nonce, allocation);
    for (const std::uint8_t b : handle_bytes) {
      name_of += "0123456789abcdef"[b >> 4];
      name_of += "0123456789abcdef"[b & 15];
    }
    auto& slot = legacy_[name_of];
    auto opening = slot.lock();
    if (!opening) {
      opening = std::make_shared<LegacyOpening>();
      opening->device = device_;
      check_rt(cudaIpcOpenMemHandle(&opening->base, handle, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle");
      slot = opening;
    }
    imported.legacy = opening;
    imported.base = static_cast<std::uint8_t*>(opening->base) + base_offset;
  } else {
    fail(FERRY_STATUS_CORRUPT_DATA, "cuda_ipc: {} sent unknown share kind {}", name,
         static_cast<int>(kind));
  }
  imported.size = size;
  ferry::sdk::log(
      FERRY_LOG_DEBUG, "cuda_ipc",
      fmt::format("imported {}'s memory {} ({} bytes, {} fds): asked and answered in "
                  "{:.3f} ms, reserved in {:.3f} ms (its chunks are mapped as copies reach them)",
                  name, memory_id, size, reply.fds.size(), (answered_ns - asked_ns) / 1e6,
                  (monotonic_ns() - answered_ns) / 1e6));
  return peer->imports.emplace(memory_id, std::move(imported)).first->second;
}

std::size_t ferry_transport::import_count() {
  std::lock_guard lock(state_mutex_);
  std::size_t n = 0;
  for (auto* p : peers_) {
    std::lock_guard peer_lock(p->mutex);
    n += p->imports.size();
  }
  return n;
}

std::uint8_t* ferry_transport::local_range(const ferry_memory_range_t& range, const char* what) {
  std::lock_guard lock(memory_mutex_);
  auto it = range.memory == nullptr ? memory_.end() : memory_.find(range.memory->id);
  if (it == memory_.end() || it->second != range.memory) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc {}: the local memory is not registered here",
         what);
  }
  if (range.offset > range.memory->size || range.size > range.memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "cuda_ipc {}: local range [{}, +{}) exceeds its registration of {} bytes", what,
         range.offset, range.size, range.memory->size);
  }
  return range.memory->base + range.offset;
}

ferry_request* ferry_transport::new_request(ferry_request::Kind kind, ferry_peer* peer) {
  auto r = std::make_unique<ferry_request>();
  r->kind = kind;
  r->peer = peer;
  std::lock_guard lock(state_mutex_);
  if (peer != nullptr && peers_.count(peer) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc {}: unknown peer", kind_name(kind));
  }
  requests_.insert(r.get());
  return r.release();
}

Key ferry_transport::checked_key(ferry_peer* peer, const ferry_blob_t& blob, const char* call) {
  const Key key = decode_key({blob.data, blob.size});
  check_key_owner(key, peer->link->remote().nonce, peer->link->name());
  if (peer->link->revoked(key.memory_id)) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "cuda_ipc {}: stale key: {} deregistered its memory {} (released or re-registered); ask "
         "it for a new key",
         call, peer->link->name(), key.memory_id);
  }
  return key;
}

Imported& ferry_transport::import_of(ferry_peer* peer, const Key& key, std::int64_t deadline_ns,
                                     const char* call) {
  Imported& imported = import(peer, key.memory_id, key.kind, deadline_ns);
  if (imported.size != key.size) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "cuda_ipc {}: stale key: {}'s memory {} is {} bytes now, the key says {}", call,
         peer->link->name(), key.memory_id, imported.size, key.size);
  }
  return imported;
}

// The memory later puts write, imported and mapped now (plugin ABI 1.9): the host calls this
// while its push waits for the trainer's kernels, so the first copies into memory the receiver
// resumed do not wait for cuMemImportFromShareableHandle, cuMemMap and cuMemSetAccess.
void ferry_transport::prepare_puts(ferry_peer* peer, std::span<const ferry_blob_t> keys,
                                   std::int64_t deadline_ns) {
  check_not_aborted();
  if (peer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc prepare_puts: peer is NULL");
  peer->link->check_alive();
  const std::int64_t start_ns = monotonic_ns();
  std::uint64_t bytes = 0;
  for (const auto& blob : keys) {
    const Key key = checked_key(peer, blob, "prepare_puts");
    Imported& imported = import_of(peer, key, effective(deadline_ns), "prepare_puts");
    ensure_cuda();
    (void)mapped(peer, imported, 0, imported.size);
    bytes += imported.size;
  }
  ferry::sdk::log(
      FERRY_LOG_DEBUG, "cuda_ipc",
      fmt::format("{}'s {} memories ({} bytes) imported and mapped for the puts to "
                  "come in {:.3f} ms",
                  peer->link->name(), keys.size(), bytes, (monotonic_ns() - start_ns) / 1e6));
}

// The peer's registered memory mapped here for the host's kernels to read (plugin ABI 1.10): a
// receiver runs its plan straight from the sender's tensors. The import is the one a put or a
// receive would make (kept per peer, so the same key maps once); the chunks of a VMM export that
// the range covers are mapped now, since the host's kernels read them next.
const void* ferry_transport::map_peer_memory(ferry_peer* peer, const ferry_blob_t& blob,
                                             std::uint64_t offset, std::uint64_t size,
                                             std::int64_t deadline_ns) {
  check_not_aborted();
  if (peer == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc map_peer_memory: peer is NULL");
  }
  peer->link->check_alive();
  const Key key = checked_key(peer, blob, "map_peer_memory");
  Imported& imported = import_of(peer, key, effective(deadline_ns), "map_peer_memory");
  if (offset > imported.size || size > imported.size - offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "cuda_ipc map_peer_memory: [{}, +{}) exceeds {}'s registration of {} bytes", offset, size,
         peer->link->name(), imported.size);
  }
  ensure_cuda();
  return mapped(peer, imported, offset, size);
}

ferry_request* ferry_transport::put(ferry_peer* peer, const ferry_put_args_t& args) {
  put_many(peer, std::span<const ferry_put_args_t>(&args, 1));
  return nullptr;
}

// Deferred (FERRY_TRANSPORT_CAP_PUT_DEFERRED): every put is checked, then all are queued at once
// with no request; the next flush issues the copies and its request reports them. A host queues
// thousands of puts per flush (put_many), so the per-put work is a key comparison, bounds checks
// and an append: the key is decoded, its owner, revocation and import looked up, once per key.
void ferry_transport::put_many(ferry_peer* peer, std::span<const ferry_put_args_t> puts) {
  check_not_aborted();
  if (peer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc put: peer is NULL");
  peer->link->check_alive();
  std::vector<PendingCopy> copies;
  copies.reserve(puts.size());
  std::vector<std::uint64_t*> empty_prints;  // written once every put passed its checks
  const ferry_blob_t* key_blob = nullptr;    // the key decoded last (pointer and size)
  std::size_t key_size = 0;
  Key key{};
  Imported* imported = nullptr;         // key's import, once a put needed it
  bool all_mapped = false;              // every chunk of *imported is mapped
  const ferry_memory* local = nullptr;  // the local registration checked last
  for (const auto& args : puts) {
    if (args.remote_key == nullptr || (args.remote_key->data == nullptr && args.remote_key->size)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc put: remote_key is NULL");
    }
    if (args.remote_key != key_blob || args.remote_key->size != key_size) {
      key = checked_key(peer, *args.remote_key, "put");
      key_blob = args.remote_key;
      key_size = args.remote_key->size;
      imported = nullptr;
    }
    const std::uint8_t* src = nullptr;
    if (args.local.memory != nullptr && args.local.memory == local) {
      // Registered (checked at this call's first put from it); only the range is new.
      if (args.local.offset > local->size || args.local.size > local->size - args.local.offset) {
        src = local_range(args.local, "put");  // fails, naming the range
      }
      src = local->base + args.local.offset;
    } else {
      src = local_range(args.local, "put");
      local = args.local.memory;
    }
    const std::uint64_t bytes = args.local.size;
    if (args.remote_offset > key.size || bytes > key.size - args.remote_offset) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "cuda_ipc put: {} bytes at offset {} exceed {}'s memory {} of {} bytes", bytes,
           args.remote_offset, peer->link->name(), key.memory_id, key.size);
    }
    const bool device_source = args.local.memory->kind == FERRY_MEMORY_CUDA;
    if (args.fingerprint_out != nullptr && !device_source) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "cuda_ipc put: fingerprint_out is offered for puts from device memory only");
    }
    if (args.chunk_hashes_out != nullptr && args.fingerprint_out == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "cuda_ipc put: chunk_hashes_out is offered with fingerprint_out only");
    }
    if (bytes == 0) {
      if (args.fingerprint_out != nullptr) empty_prints.push_back(args.fingerprint_out);
      continue;
    }
    if (imported == nullptr) {
      imported = &import_of(peer, key, effective(args.deadline_ns), "put");
      ensure_cuda();
      std::lock_guard lock(peer->mutex);
      all_mapped = imported->all_mapped;
    }
    std::uint8_t* const dst = all_mapped ? imported->base + args.remote_offset
                                         : mapped(peer, *imported, args.remote_offset, bytes);
    copies.push_back({peer, dst, src, bytes, device_source, args.fingerprint_out,
                      args.chunk_hashes_out, args.chunk_index_base});
  }
  // xxh64-interleaved-v1 of nothing: the combining XXH64 of no chunk hashes, seed 0.
  for (auto* out : empty_prints) {
    *out = ferry::sdk::xxh64::finish(ferry::sdk::xxh64::kPrime5, 0, nullptr, 0);
  }
  if (copies.empty()) return;
  std::lock_guard lock(cuda_mutex_);
  next_ticket_ += copies.size();
  pending_.insert(pending_.end(), copies.begin(), copies.end());
}

void ferry_transport::issue_pending_locked() {
  if (pending_.empty()) return;
  std::vector<PendingCopy> copies;
  copies.swap(pending_);
  issued_ticket_ = next_ticket_;
  DeviceScope scope(device_);
  // Device-to-device copies go as one kernel launch per kMaxCopyOps (batch_copy.hpp); copies
  // from host memory, a lone copy, or a launch that fails go one cudaMemcpyAsync each.
  std::vector<CopyOp> ops;
  ops.reserve(copies.size());
  std::vector<CopyOp> print_ops;  // the copies that also fingerprint what they write
  std::vector<std::uint64_t*> outs;
  std::vector<std::uint64_t> chunk_bases;  // per print op
  std::vector<PrintBatch::ChunkOut> chunk_outs;
  std::uint64_t print_chunks = 0;
  auto copy_call = [&](const void* src, void* dst, std::uint64_t bytes) {
    check_rt(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
             "cudaMemcpyAsync into the peer's memory");
    stream_own_work_ = true;
  };
  for (const auto& c : copies) {
    if (c.fingerprint_out != nullptr) {
      print_ops.push_back({c.src, c.dst, c.bytes});
      outs.push_back(c.fingerprint_out);
      chunk_bases.push_back(c.chunk_index_base);
      const std::uint64_t chunks = fingerprinted_copy_chunks(&print_ops.back(), 1);
      if (c.chunk_hashes_out != nullptr)
        chunk_outs.push_back({c.chunk_hashes_out, print_chunks, chunks});
      print_chunks += chunks;
    } else if (c.device_source) {
      ops.push_back({c.src, c.dst, c.bytes});
    } else {
      copy_call(c.src, c.dst, c.bytes);
    }
  }
  if (!print_ops.empty()) {
    const std::size_t n = print_ops.size();
    // The lane of this launch (lanes_): it waits for stream_ (the previous launch included) only
    // where running beside it could reorder writes to the same bytes.
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    ranges.reserve(print_ops.size());
    for (const auto& op : print_ops) {
      const auto at = reinterpret_cast<std::uintptr_t>(op.dst);
      if (op.bytes > 0) ranges.emplace_back(at, at + op.bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    // Two sorted, merged lists overlap when some pair does: one sweep.
    bool overlaps = false;
    for (std::size_t a = 0, b = 0; a < merged.size() && b < last_ranges_.size() && !overlaps;) {
      if (merged[a].second <= last_ranges_[b].first) {
        ++a;
      } else if (last_ranges_[b].second <= merged[a].first) {
        ++b;
      } else {
        overlaps = true;
      }
    }
    const unsigned l = next_lane_;
    next_lane_ = (next_lane_ + 1) % copy_lanes_;
    cudaStream_t lane = lanes_[l];
    const std::int64_t t_issue = monotonic_ns();
    if (stream_own_work_ || copy_lanes_ == 1 || overlaps) {
      check_rt(cudaEventRecord(stream_tail_, stream_), "cudaEventRecord");
      check_rt(cudaStreamWaitEvent(lane, stream_tail_, 0), "cudaStreamWaitEvent");
      stream_own_work_ = false;
    }
    last_ranges_ = std::move(merged);
    PrintBatch batch;
    batch.lane = l;
    for (const auto& op : print_ops) batch.bytes += op.bytes;
    batch.began = take_event(true);
    batch.ended = take_event(true);
    check_rt(cudaEventRecord(batch.began, lane), "cudaEventRecord");
    // One pinned array: the n fingerprints read back, then the kernel's op table.
    const std::size_t table_words =
        (fingerprinted_copy_staging_bytes(n) + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t);
    // and, where a put asked for them, every chunk hash of the launch.
    const std::uint64_t hash_words = chunk_outs.empty() ? 0 : print_chunks;
    const std::int64_t t_pin0 = monotonic_ns();
    std::tie(batch.host, batch.capacity) = take_pinned_prints(n + table_words + hash_words);
    batch.pinned_ms = (monotonic_ns() - t_pin0) / 1e6;
    if (hash_words > 0) batch.chunk_hashes = batch.host + n + table_words;
    std::uint64_t* device_prints = nullptr;
    try {
      check_rt(ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&device_prints),
                                               n * sizeof(std::uint64_t), lane),
               "allocating the fingerprints (scratch pool)");
      const std::int64_t t_l0 = monotonic_ns();
      batch.malloc_ms = (t_l0 - t_pin0) / 1e6 - batch.pinned_ms;
      check_rt(launch_fingerprinted_copy(print_ops.data(), n, device_prints, batch.host + n, lane,
                                         chunk_bases.data(), batch.chunk_hashes),
               "the fingerprinting copy kernel into the peer's memory");
      batch.launch_ms = (monotonic_ns() - t_l0) / 1e6;
      check_rt(cudaMemcpyAsync(batch.host, device_prints, n * sizeof(std::uint64_t),
                               cudaMemcpyDeviceToHost, lane),
               "cudaMemcpyAsync (fingerprint read-back)");
      check_rt(cudaFreeAsync(device_prints, lane), "cudaFreeAsync (fingerprints)");
      check_rt(cudaEventRecord(batch.ended, lane), "cudaEventRecord");
    } catch (...) {
      free_timing_events_.push_back(batch.began);
      free_timing_events_.push_back(batch.ended);
      if (device_prints != nullptr) (void)cudaFreeAsync(device_prints, lane);
      // stream_ still waits for what the lane was given (the next flush's event covers it).
      (void)cudaEventRecord(lane_done_[l], lane);
      (void)cudaStreamWaitEvent(stream_, lane_done_[l], 0);
      give_pinned_prints(batch.host, batch.capacity);
      throw;
    }
    check_rt(cudaEventRecord(lane_done_[l], lane), "cudaEventRecord");
    check_rt(cudaStreamWaitEvent(stream_, lane_done_[l], 0), "cudaStreamWaitEvent");
    batch.issue_ms = (monotonic_ns() - t_issue) / 1e6;
    batch.outs = std::move(outs);
    batch.chunk_outs = std::move(chunk_outs);
    batch.issued = issued_ticket_;
    print_batches_.push_back(std::move(batch));
  }
  if (ops.size() == 1) {
    copy_call(ops[0].src, ops[0].dst, ops[0].bytes);
    return;
  }
  if (!ops.empty()) stream_own_work_ = true;
  for (std::size_t first = 0; first < ops.size(); first += kMaxCopyOps) {
    const std::size_t n = std::min(kMaxCopyOps, ops.size() - first);
    if (launch_batch_copy(ops.data() + first, n, stream_) == cudaSuccess) continue;
    (void)cudaGetLastError();
    for (std::size_t k = first; k < first + n; ++k) copy_call(ops[k].src, ops[k].dst, ops[k].bytes);
  }
}

void ferry_transport::deliver_prints_locked(std::uint64_t covers) noexcept {
  while (!print_batches_.empty() && print_batches_.front().issued <= covers) {
    PrintBatch batch = std::move(print_batches_.front());
    print_batches_.pop_front();
    for (std::size_t i = 0; i < batch.outs.size(); ++i) *batch.outs[i] = batch.host[i];
    for (const auto& c : batch.chunk_outs) {
      std::memcpy(c.out, batch.chunk_hashes + c.first, c.count * sizeof(std::uint64_t));
    }
    give_pinned_prints(batch.host, batch.capacity);
    log_launch_locked(batch);
  }
}

// "launch on lane L: N copies, B bytes in X ms (Y GB/s), began Z ms after the previous one":
// whether consecutive launches ran side by side, and at what rate. The events are complete here
// (the flush that covers the batch completed).
void ferry_transport::log_launch_locked(PrintBatch& batch) noexcept {
  if (batch.began == nullptr || batch.ended == nullptr) return;
  float ran_ms = 0;
  float after_ms = -1;
  const bool timed = cudaEventElapsedTime(&ran_ms, batch.began, batch.ended) == cudaSuccess;
  if (previous_began_ != nullptr &&
      cudaEventElapsedTime(&after_ms, previous_began_, batch.began) != cudaSuccess) {
    after_ms = -1;
  }
  (void)cudaGetLastError();
  if (timed) {
    try {
      ferry::sdk::log(
          FERRY_LOG_DEBUG, "cuda_ipc",
          fmt::format("fingerprinting copy on lane {} (issued in {:.3f} ms: page-locked array "
                      "{:.3f}, allocation {:.3f}, launch {:.3f}): {} copies, {} bytes in {:.3f} ms "
                      "({:.0f} GB/s){}",
                      batch.lane, batch.issue_ms, batch.pinned_ms, batch.malloc_ms, batch.launch_ms,
                      batch.outs.size(), batch.bytes, ran_ms,
                      ran_ms > 0 ? batch.bytes / (ran_ms * 1e6) : 0.0,
                      after_ms >= 0
                          ? fmt::format(", began {:.3f} ms after the previous launch", after_ms)
                          : std::string()));
    } catch (...) {
    }
  }
  try {
    if (previous_began_ != nullptr) free_timing_events_.push_back(previous_began_);
    previous_began_ = batch.began;
    free_timing_events_.push_back(batch.ended);
  } catch (...) {
    (void)cudaEventDestroy(batch.ended);
  }
  batch.began = nullptr;
  batch.ended = nullptr;
}

ferry_request* ferry_transport::flush(ferry_peer* peer, std::int64_t /*deadline_ns*/) {
  check_not_aborted();
  if (peer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc flush: peer is NULL");
  peer->link->check_alive();
  ensure_cuda();
  ferry_request* r = new_request(ferry_request::Kind::Flush, peer);
  try {
    std::lock_guard lock(cuda_mutex_);
    issue_pending_locked();
    DeviceScope scope(device_);
    r->event = take_event();
    check_rt(cudaEventRecord(r->event, stream_), "cudaEventRecord");
    r->covers = issued_ticket_;
  } catch (...) {
    request_free(r);
    throw;
  }
  return r;
}

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  check_not_aborted();
  if (peer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc send_bucket: peer is NULL");
  (void)local_range(bucket.data, "send_bucket");
  resolve_share(*bucket.data.memory);
  if (!bucket.data.memory->not_shareable.empty()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "cuda_ipc send_bucket: {}",
         bucket.data.memory->not_shareable);
  }
  bucket.data.memory->offered = true;
  ferry_request* r = new_request(ferry_request::Kind::Send, peer);
  r->bucket_index = bucket.bucket_index;
  try {
    peer->link->send(Frame{MessageType::BucketReady,
                           PayloadWriter()
                               .u32(bucket.bucket_index)
                               .u64(bucket.data.memory->id)
                               .u64(bucket.data.offset)
                               .u64(bucket.data.size)
                               .take(),
                           {}});
  } catch (...) {
    request_free(r);
    throw;
  }
  return r;
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  check_not_aborted();
  if (peer == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "cuda_ipc recv_bucket: peer is NULL");
  std::uint8_t* dst = local_range(bucket.data, "recv_bucket");
  ferry_request* r = new_request(ferry_request::Kind::Recv, peer);
  r->bucket_index = bucket.bucket_index;
  r->dst = dst;
  r->capacity = bucket.data.size;
  return r;
}

bool ferry_transport::progress(ferry_request* r, std::int64_t deadline_ns) {
  if (r->done) {
    if (r->code != FERRY_STATUS_OK) throw Error(r->code, r->message);
    return true;
  }
  // Waits for r->event; false at the deadline.
  auto event_done = [&]() -> bool {
    int spins = 0;
    for (;;) {
      const cudaError_t q = cudaEventQuery(r->event);
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady) check_rt(q, "the copy (cudaEventQuery)");
      check_not_aborted();
      if (monotonic_ns() >= deadline_ns) return false;
      if (++spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 200));
      }
    }
  };
  try {
    if (r->peer == nullptr) {
      fail(FERRY_STATUS_FAILED_PRECONDITION, "cuda_ipc: the peer of this request was disconnected");
    }
    PeerLink& link = *r->peer->link;
    const bool may_block = deadline_ns > monotonic_ns();
    switch (r->kind) {
      case ferry_request::Kind::Flush: {
        {
          DeviceScope scope(device_);
          if (!event_done()) return false;
        }
        {
          std::lock_guard lock(cuda_mutex_);
          deliver_prints_locked(r->covers);
        }
        // The bytes landed; a peer that died meanwhile must not be reported as served.
        link.check_alive();
        break;
      }
      case ferry_request::Kind::Send: {
        if (!link.take_released(r->bucket_index)) {
          if (!may_block) return false;
          link.wait_released(r->bucket_index, deadline_ns);
        }
        break;
      }
      case ferry_request::Kind::Recv: {
        if (r->stage == 0) {
          auto ready = link.take_ready(r->bucket_index);
          if (!ready) {
            if (!may_block) return false;
            ready = link.wait_ready(r->bucket_index, deadline_ns);
          }
          if (ready->size > r->capacity) {
            fail(FERRY_STATUS_INVALID_ARGUMENT,
                 "cuda_ipc recv_bucket: {} announced bucket {} of {} bytes, the receive range "
                 "holds {}",
                 link.name(), ready->index, ready->size, r->capacity);
          }
          // The announced slot is one of the sender's registrations, VMM or legacy.
          Imported* imported = &import(r->peer, ready->memory_id, std::nullopt, deadline_ns);
          if (ready->offset > imported->size || ready->size > imported->size - ready->offset) {
            fail(FERRY_STATUS_CORRUPT_DATA,
                 "cuda_ipc recv_bucket: {} announced bucket {} at [{}, +{}) outside its memory "
                 "{} of {} bytes",
                 link.name(), ready->index, ready->offset, ready->size, ready->memory_id,
                 imported->size);
          }
          std::uint8_t* const src = mapped(r->peer, *imported, ready->offset, ready->size);
          std::lock_guard lock(cuda_mutex_);
          DeviceScope scope(device_);
          stream_own_work_ = true;
          check_rt(cudaMemcpyAsync(r->dst, src, ready->size, cudaMemcpyDefault, stream_),
                   "cudaMemcpyAsync from the sender's staging bucket");
          r->event = take_event();
          check_rt(cudaEventRecord(r->event, stream_), "cudaEventRecord");
          r->stage = 1;
        }
        {
          DeviceScope scope(device_);
          if (!event_done()) return false;
        }
        // Our copy is complete: the sender may reuse its slot.
        link.send(
            Frame{MessageType::BucketReleased, PayloadWriter().u32(r->bucket_index).take(), {}});
        break;
      }
    }
    r->done = true;
    return true;
  } catch (const Error& e) {
    if (e.code() == FERRY_STATUS_TIMEOUT) throw;  // the request stays valid
    r->done = true;
    r->code = e.code();
    r->message = e.what();
    throw;
  }
}

void ferry_transport::request_wait(ferry_request* request, std::int64_t deadline_ns) {
  if (!progress(request, effective(deadline_ns))) {
    const std::string peer = request->peer != nullptr ? request->peer->link->name() : "a peer";
    fail(FERRY_STATUS_TIMEOUT, "cuda_ipc: deadline passed waiting for a request to {}", peer);
  }
}

void ferry_transport::request_free(ferry_request* r) noexcept {
  if (r == nullptr) return;
  {
    std::lock_guard lock(state_mutex_);
    if (requests_.erase(r) == 0) return;
  }
  if (r->event != nullptr) {
    std::lock_guard lock(cuda_mutex_);
    return_event(r->event);
  }
  delete r;
}

void ferry_transport::abort(const char* reason) noexcept {
  try {
    const std::string why = reason != nullptr && *reason != '\0' ? reason : "abort requested";
    {
      std::lock_guard lock(state_mutex_);
      aborted_ = why;
    }
    endpoint_->abort(why);
  } catch (...) {
    // Out of memory while copying the reason: nothing better to do.
  }
}
