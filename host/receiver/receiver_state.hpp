// receiver/receiver_state.hpp: what one Receiver holds (Receiver::State), shared by the files
// that implement it: receiver.cpp (the control operations and their state), receiver_layout.cpp
// (the layout: model family, store, engine; the start from the host mirror) and
// receiver_updates.cpp (every update, through the update loop). Internal to host/receiver.
//
// Threading: update_mutex serializes mutating operations; the atomics are read without it.
#pragma once

#include "receiver/receiver.hpp"

#include <ferry/sdk/manifest.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "order/stream_order.hpp"
#include "registry/registry.hpp"
#include "store/weight_store.hpp"
#include "update/model_binding.hpp"
#include "update/update_engine.hpp"

namespace ferry::store {
class HostMirror;
}

namespace ferry::receiver {

// The store tag of the weights.
inline constexpr const char* kWeightsTag = "weights";

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline store::Policy to_store_policy(config::ReleasePolicy p) {
  return p == config::ReleasePolicy::backup ? store::Policy::Backup : store::Policy::Discard;
}

// Reads config.json next to a checkpoint (the folder itself, or the folder of a file); "" when
// there is none. Never blocks: a FIFO or device there is refused.
std::string read_config_json(const std::filesystem::path& checkpoint);

struct Receiver::State {
  config::Config config;
  const registry::Registry& registry;
  EngineControl engine_control;   // the engine around the receiver (engine_control.hpp)
  std::mutex update_mutex;        // one mutating operation at a time
  std::atomic<bool> busy{false};
  std::atomic<const char*> activity{""};  // "loading" / "updating" while busy

  std::shared_ptr<const registry::LoadedPlugin> model_plugin;
  std::unique_ptr<update::ModelBinding> binding;
  std::unique_ptr<store::WeightStore> store;  // CPU or CUDA, from receiver.device
  std::unique_ptr<update::UpdateEngine> engine;
  // Set (release) once binding/store/engine exist; they never change afterwards. Lock-free
  // readers (health, version, metrics, memory state) check it (acquire) before touching them.
  std::atomic<bool> has_layout{false};
  std::map<std::string, ferry_tensor_desc_t> catalog;  // checkpoint tensors by name
  std::vector<std::string> catalog_names;              // owns the names `catalog` points at
  // manifest::catalog_key of the last session catalog found equal to `catalog` (open_session):
  // a session with the same tensor list skips the check. Cleared whenever `catalog` changes.
  std::string accepted_catalog;
  // Bumped by release() and resume(), under update_mutex (StreamingUpdate::memory_epoch reads it
  // under that lock; Receiver::memory_epoch without it).
  std::atomic<std::uint64_t> memory_epoch{0};
  std::mutex release_hook_mutex;  // guards both hooks (set from the endpoint's thread)
  std::function<void(const std::string&)> release_hook;
  std::function<void()> resume_hook;
  // Stream ordering against the engine (set_engine_order; read under update_mutex). The devices
  // are those of engine-owned CUDA parameters: empty for ferry-owned weights.
  order::StreamOrder engine_order;
  std::vector<int> engine_devices;
  std::atomic<int> cuda_device{-1};  // weights_cuda_device() once a store exists

  // memory.mirror_path's file, opened by start() because it holds a committed version: the
  // first layout attaches it (attach_mirror checks its layout) instead of a fresh file.
  std::shared_ptr<store::HostMirror> mirror_to_restore;

  State(const config::Config& c, const registry::Registry& r) : config(c), registry(r) {}

  // ---- receiver_layout.cpp
  // The file-backed host mirror of a new store: the one start() opened, else a fresh file (which
  // replaces an old one) recording `cat` and `config_json` for a restart without model_path.
  std::shared_ptr<store::HostMirror> file_mirror(const store::WeightStore& new_store,
                                                 const manifest::Manifest& cat,
                                                 const std::string& config_json);
  // start(): restores the committed version of memory.mirror_path's file when it holds one whose
  // layout is this receiver's (made from `model_path`'s headers, or from the mirror's own record
  // when `model_path` is empty). Returns false, having said why at warn (info when there is no
  // file yet), when it does not; a layout may exist then (the caller's load uses it).
  bool restore_at_start(const std::filesystem::path& model_path);
  // The layout from a catalog and the checkpoint's config.json text (may be empty); `checkpoint`
  // names the source (a path, or the sender of a session) in messages. With engine-owned
  // parameters registered (register_params) the layout must match them instead.
  void create_layout(const manifest::Manifest& cat, const std::string& config_json,
                     const std::filesystem::path& checkpoint);
  // The model binding of `family` for this rank.
  std::unique_ptr<update::ModelBinding> make_binding(const std::string& family,
                                                     const std::string& config_json);
  // The update engine's options from the config.
  update::UpdateOptions engine_options() const;
  void keep_catalog(const manifest::Manifest& cat);
  // Engine-owned parameters exist (register_params): the model plugin's layout for `cat` must be
  // exactly the registered parameters (INCOMPATIBLE naming the first difference).
  void create_layout_over_registered(const manifest::Manifest& cat, const std::string& config_json);
  // A later checkpoint must describe the same tensors as the first one.
  void check_catalog(const manifest::Manifest& cat) const;

  unsigned threads() const { return config.update.apply_threads; }

  // Before an update's first write into engine-owned parameters: the engine's queued work on
  // them (a forward pass still reading them) is done. Caller holds update_mutex.
  void wait_for_engine(std::uint64_t version) const {
    if (engine_devices.empty()) return;
    order::wait(engine_order, engine_devices,
                fmt::format("update {}: waiting for the engine's work on its parameters", version));
  }

  void require_weights_resident() const {
    if (store && store->released(kWeightsTag)) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "weights are released; call resume_memory_occupation first");
    }
  }
};

// Marks the receiver busy ("loading" / "updating": health()) for its lifetime.
struct BusyGuard {
  std::atomic<bool>& busy;
  std::atomic<const char*>& activity;
  BusyGuard(std::atomic<bool>& b, std::atomic<const char*>& a, const char* what)
      : busy(b), activity(a) {
    activity.store(what);
    busy.store(true);
  }
  ~BusyGuard() {
    busy.store(false);
    activity.store("");
  }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;
};

}  // namespace ferry::receiver
