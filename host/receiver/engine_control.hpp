// receiver/engine_control.hpp: what an inference engine around a receiver is asked to do when
// weights change (SGLang's /pause_generation, /continue_generation, /flush_cache, the
// /begin_weight_update .. /end_weight_update session, the kv_cache memory tag), and the state of
// those requests. An embedded receiver's engine registers callbacks (C API
// ferry_receiver_set_engine_callbacks, Python ferry.Receiver.set_engine_callbacks); `ferry serve`
// registers none and serves no generation, so each request is answered from the state alone
// (nothing to pause, no cache to flush, no post-load processing).
//
// Contract: a callback that fails (throws; the C API's returns an error) fails the request that
// ran it, with the callback's message: nothing is swallowed. Callbacks run on the thread of the
// request, never two at a time, and must not call back into the receiver's control operations.
// Threading: every method may be called from any thread; they are serialized internally.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ferry::receiver {

// SGLang's PauseGenerationReqInput.mode.
enum class PauseMode { abort, retract, in_place };
const char* pause_mode_name(PauseMode mode);

struct EngineCallbacks {
  // Stops generation; returns how many requests it paused (or aborted, mode abort).
  std::function<std::uint64_t(PauseMode)> pause;
  // Resumes generation; `torch_empty_cache`: SGLang's ContinueGenerationReqInput field.
  std::function<void(bool torch_empty_cache)> resume;
  // Drops the engine's caches that depend on the weights (the radix / prefix cache).
  std::function<void(bool torch_empty_cache)> flush_cache;
  // Post-load processing once new weights are in place (SGLang's process_weights_after_loading):
  // at /end_weight_update, or after an update made outside a weight-update session.
  std::function<void()> post_load;
  // Releases (release true) or resumes memory of engine-owned tags, a subset of memory_tags.
  std::function<void(const std::vector<std::string>& tags, bool release)> memory;
  // The memory tags the engine owns ("kv_cache", "cuda_graph"): never ferry's store tags.
  std::vector<std::string> memory_tags;
};

// Around one weight update (the SGLang request fields of that update).
struct UpdateEffects {
  bool flush_cache = true;          // flush the engine's caches after a committed update
  bool torch_empty_cache = false;   // passed to flush_cache
  bool abort_all_requests = false;  // pause(abort) before the update
  bool keep_pause = false;          // after abort_all_requests: stay paused (disk updates)
};

class EngineControl {
 public:
  // Replaces every callback at once (all empty: none). FAILED_PRECONDITION while generation is
  // paused or a weight-update session is open (the engine's state would be split between two
  // sets). INVALID_ARGUMENT for memory_tags without a memory callback, or naming a store tag
  // (weights, staging).
  void set_callbacks(EngineCallbacks callbacks);
  bool has_engine() const;  // any callback registered

  // Returns num_paused_requests (0 without an engine). Pausing again changes the mode.
  std::uint64_t pause(PauseMode mode);
  // Resumes (the callback runs when generation was paused). Returns whether it was paused.
  bool resume(bool torch_empty_cache);
  // Returns whether an engine cache was flushed (false: no engine callback).
  bool flush_cache(bool torch_empty_cache);

  // /begin_weight_update: `selector` "target" or "all" (ferry holds only a target model; "draft"
  // is INVALID_ARGUMENT: it would put draft weights into the target). FAILED_PRECONDITION when a
  // session is open.
  void begin_update(const std::string& selector);
  // /end_weight_update: closes the session, then runs post_load. FAILED_PRECONDITION without an
  // open session. The session is closed even when post_load fails (the error says so).
  void end_update();

  struct State {
    bool paused = false;
    std::optional<PauseMode> pause_mode;
    bool session_open = false;
    std::string selector;  // of the open session
    std::uint64_t updates_in_session = 0;
  };
  State state() const;

  // Runs `update` with the SGLang effects around it: abort_all_requests pauses (mode abort)
  // first and resumes afterwards unless generation was paused already or keep_pause; after a
  // committed update, flush_cache and, outside a session, post_load. A callback that fails
  // after the update committed is reported as an error that says the update committed.
  void run_update(const UpdateEffects& effects, const std::function<void()>& update);

  // The engine's memory tags (empty without an engine), and their release/resume.
  std::vector<std::string> memory_tags() const;
  void memory(const std::vector<std::string>& tags, bool release);

 private:
  // Runs one callback under calls_; rethrows its failure as an Error naming `what`.
  template <typename F>
  auto call(const char* what, F&& f);

  mutable std::mutex mutex_;  // callbacks_, state_
  std::mutex calls_;          // one callback at a time
  EngineCallbacks callbacks_;
  State state_;
};

}  // namespace ferry::receiver
