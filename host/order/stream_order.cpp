// order/stream_order.cpp: waits for producers' and engines' CUDA work (see stream_order.hpp).
#include "order/stream_order.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry::order {

const char* wait_name(Wait wait) {
  switch (wait) {
    case Wait::sync_devices: return "sync_devices";
    case Wait::streams: return "streams";
    case Wait::events: return "events";
    case Wait::none: return "none";
  }
  return "unknown";
}

StreamOrder checked_order(std::uint32_t wait, const void* const* handles, std::size_t count,
                          std::string_view what) {
  if (wait > static_cast<std::uint32_t>(Wait::none)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: stream order {} is not one of FERRY_ORDER_SYNC_DEVICES, _STREAMS, _EVENTS, _NONE",
         what, wait);
  }
  StreamOrder order;
  order.wait = static_cast<Wait>(wait);
  const bool takes_handles = order.wait == Wait::streams || order.wait == Wait::events;
  if (takes_handles && count == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: stream order '{}' names no {} (num_handles is 0)",
         what, wait_name(order.wait), order.wait == Wait::streams ? "stream" : "event");
  }
  if (!takes_handles && count != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: stream order '{}' takes no handles, and {} were given", what,
         wait_name(order.wait), count);
  }
  if (count > 0 && handles == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: handles is NULL with num_handles {}", what, count);
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (order.wait == Wait::events && handles[i] == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: event {} is NULL", what, i);
    }
    order.handles.push_back(reinterpret_cast<std::uintptr_t>(handles[i]));
  }
  return order;
}

#if FERRY_HAVE_CUDA
namespace {

// Restores the calling thread's current device when it leaves scope.
class KeepDevice {
 public:
  KeepDevice() { had_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~KeepDevice() {
    if (had_) cudaSetDevice(device_);
  }
  KeepDevice(const KeepDevice&) = delete;
  KeepDevice& operator=(const KeepDevice&) = delete;

 private:
  int device_ = 0;
  bool had_ = false;
};

void check(cudaError_t e, std::string_view what, std::string_view call) {
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "{}: waiting for the producer's CUDA work: {}: {}", what, call,
         cudaGetErrorString(e));
  }
}

// One reusable event per device (timing off): recording and waiting cost ~microseconds, creating
// one per wait would cost as much again. Guarded: waits may run on several threads at once.
class EventPool {
 public:
  cudaEvent_t take(int device, std::string_view what) {
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        cudaEvent_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), what, "cudaEventCreate");
    return e;
  }
  void give(int device, cudaEvent_t e) {
    std::lock_guard lock(mutex_);
    free_[device].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudaEvent_t>> free_;  // leaked at exit on purpose (no CUDA calls then)
};

EventPool& events() {
  static auto* pool = new EventPool();
  return *pool;
}

bool special_stream(std::uintptr_t handle) { return handle <= 2; }

// What a Pending waits for: events it recorded on streams (given back to the pool afterwards),
// devices to synchronise, or the caller's events.
struct Marks {
  std::vector<std::pair<int, cudaEvent_t>> recorded;
  std::vector<int> devices;         // sync_devices
  std::vector<cudaEvent_t> events;  // the caller's (Wait::events)
};

// Records an event on `stream` (of `device`): what is queued there until now.
void record_on(Marks& marks, int device, cudaStream_t stream, std::string_view what) {
  check(cudaSetDevice(device), what, "cudaSetDevice");
  cudaEvent_t e = events().take(device, what);
  const cudaError_t r = cudaEventRecord(e, stream);
  if (r != cudaSuccess) {
    events().give(device, e);
    fail(FERRY_STATUS_IO, "{}: marking the work queued on stream {} (device {}): {}", what,
         static_cast<const void*>(stream), device, cudaGetErrorString(r));
  }
  marks.recorded.emplace_back(device, e);
}

}  // namespace

struct Pending::Impl {
  std::string what;
  Marks marks;
  std::mutex mutex;
  bool done = false;
  std::exception_ptr failure;
  double waited_s = 0;

  void give_back() {
    for (const auto& [device, e] : marks.recorded) events().give(device, e);
    marks.recorded.clear();
  }

  void wait_marks() {
    KeepDevice keep;
    for (const int d : marks.devices) {
      check(cudaSetDevice(d), what, "cudaSetDevice");
      check(cudaDeviceSynchronize(), what, "cudaDeviceSynchronize");
    }
    for (const auto& [device, e] : marks.recorded) {
      const cudaError_t r = cudaEventSynchronize(e);
      if (r != cudaSuccess) {
        fail(FERRY_STATUS_IO, "{}: waiting for the work queued on a stream of device {}: {}", what,
             device, cudaGetErrorString(r));
      }
    }
    for (const cudaEvent_t e : marks.events) {
      const cudaError_t r = cudaEventSynchronize(e);
      if (r != cudaSuccess) {
        fail(FERRY_STATUS_IO, "{}: waiting for event {}: {}", what, static_cast<const void*>(e),
             cudaGetErrorString(r));
      }
    }
  }
};

Pending::Pending(const StreamOrder& order, std::span<const int> devices, std::string what)
    : impl_(std::make_unique<Impl>()) {
  auto& i = *impl_;
  i.what = std::move(what);
  const std::set<int> unique(devices.begin(), devices.end());
  switch (order.wait) {
    case Wait::none:
      break;
    case Wait::sync_devices:
      i.marks.devices.assign(unique.begin(), unique.end());
      break;
    case Wait::events:
      for (const auto handle : order.handles) {
        i.marks.events.push_back(reinterpret_cast<cudaEvent_t>(handle));
      }
      break;
    case Wait::streams: {
      KeepDevice keep;
      try {
        for (const auto handle : order.handles) {
          auto* stream = reinterpret_cast<cudaStream_t>(handle);
          if (special_stream(handle)) {
            // Memory on no device (page-locked host buffers a device-to-host copy fills): the
            // calling thread's current device, where there is one. (The per-thread default
            // stream is this thread's: marked here, on the caller's thread.)
            int current = 0;
            if (unique.empty() && cudaGetDevice(&current) == cudaSuccess) {
              record_on(i.marks, current, stream, i.what);
            }
            for (const int d : unique) record_on(i.marks, d, stream, i.what);
            continue;
          }
          int device = 0;
          check(cudaStreamGetDevice(stream, &device), i.what, "cudaStreamGetDevice");
          record_on(i.marks, device, stream, i.what);
        }
      } catch (...) {
        i.give_back();
        throw;
      }
      break;
    }
  }
}

Pending::~Pending() {
  if (impl_) impl_->give_back();
}

void Pending::wait() {
  auto& i = *impl_;
  std::lock_guard lock(i.mutex);
  if (i.failure) std::rethrow_exception(i.failure);
  if (i.done) return;
  const auto start = std::chrono::steady_clock::now();
  try {
    i.wait_marks();
  } catch (...) {
    i.failure = std::current_exception();
    i.give_back();
    throw;
  }
  i.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  i.done = true;
  i.give_back();
}

double Pending::waited_seconds() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->waited_s;
}

void wait(const StreamOrder& order, std::span<const int> devices, std::string_view what) {
  if (order.wait == Wait::none) return;
  if (order.wait == Wait::sync_devices && devices.empty()) return;
  Pending pending(order, devices, std::string(what));
  pending.wait();
}

std::uintptr_t consumer_stream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, cudaStream_t>();  // alive until exit, like the process
  std::lock_guard lock(mutex);
  if (auto it = streams->find(device); it != streams->end()) {
    return reinterpret_cast<std::uintptr_t>(it->second);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    fail(FERRY_STATUS_NOT_FOUND, "consumer stream: CUDA device {} is not visible ({} visible)",
         device, count);
  }
  KeepDevice keep;
  check(cudaSetDevice(device), "consumer stream", "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "consumer stream",
        "cudaStreamCreate");
  streams->emplace(device, s);
  return reinterpret_cast<std::uintptr_t>(s);
}

#else  // no CUDA in this build

struct Pending::Impl {};

Pending::Pending(const StreamOrder& order, std::span<const int> devices, std::string what) {
  if (order.wait == Wait::none) return;
  if (order.wait == Wait::sync_devices && devices.empty()) return;
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "{}: stream order '{}' needs CUDA, and this build has none (-Dcuda=disabled)", what,
       wait_name(order.wait));
}

Pending::~Pending() = default;
void Pending::wait() {}
double Pending::waited_seconds() const {
  return 0;
}

void wait(const StreamOrder& order, std::span<const int> devices, std::string_view what) {
  Pending(order, devices, std::string(what)).wait();
}

std::uintptr_t consumer_stream(int device) {
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "consumer stream for CUDA device {}: this build has no CUDA (-Dcuda=disabled)", device);
}

#endif

}  // namespace ferry::order
