// receiver/engine_control.cpp: the engine's callbacks around weight updates and the state of
// pause, flush and the weight-update session (see engine_control.hpp).
#include "receiver/engine_control.hpp"

#include <fmt/ranges.h>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <exception>
#include <utility>

namespace ferry::receiver {

const char* pause_mode_name(PauseMode mode) {
  switch (mode) {
    case PauseMode::abort:
      return "abort";
    case PauseMode::retract:
      return "retract";
    case PauseMode::in_place:
      return "in_place";
  }
  return "abort";
}

template <typename F>
auto EngineControl::call(const char* what, F&& f) {
  const std::lock_guard lock(calls_);
  try {
    return f();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("the engine's {} callback failed: {}", what, e.what()));
  } catch (const std::exception& e) {
    throw Error(FERRY_STATUS_INTERNAL,
                fmt::format("the engine's {} callback failed: {}", what, e.what()));
  } catch (...) {
    throw Error(FERRY_STATUS_INTERNAL,
                fmt::format("the engine's {} callback failed (not a std::exception)", what));
  }
}

void EngineControl::set_callbacks(EngineCallbacks callbacks) {
  if (!callbacks.memory_tags.empty() && !callbacks.memory) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "engine callbacks: memory_tags ({}) given without a memory callback",
         fmt::join(callbacks.memory_tags, ", "));
  }
  for (const auto& tag : callbacks.memory_tags) {
    if (tag.empty() || tag == "weights" || tag == "staging") {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "engine callbacks: memory tag '{}' is not the engine's ('weights' and 'staging' are "
           "ferry's store tags)",
           tag);
    }
  }
  const std::lock_guard lock(mutex_);
  if (state_.paused || state_.session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "engine callbacks cannot change while generation is paused or a weight-update session "
         "is open (continue_generation / end_weight_update first)");
  }
  callbacks_ = std::move(callbacks);
}

bool EngineControl::has_engine() const {
  const std::lock_guard lock(mutex_);
  return callbacks_.pause || callbacks_.resume || callbacks_.flush_cache || callbacks_.post_load ||
         callbacks_.memory;
}

std::uint64_t EngineControl::pause(PauseMode mode) {
  std::function<std::uint64_t(PauseMode)> f;
  {
    const std::lock_guard lock(mutex_);
    f = callbacks_.pause;
  }
  const std::uint64_t paused = f ? call("pause", [&] { return f(mode); }) : 0;
  const std::lock_guard lock(mutex_);
  state_.paused = true;
  state_.pause_mode = mode;
  return paused;
}

bool EngineControl::resume(bool torch_empty_cache) {
  std::function<void(bool)> f;
  bool was_paused = false;
  {
    const std::lock_guard lock(mutex_);
    f = callbacks_.resume;
    was_paused = state_.paused;
  }
  if (was_paused && f) call("resume", [&] { f(torch_empty_cache); });
  const std::lock_guard lock(mutex_);
  state_.paused = false;
  state_.pause_mode.reset();
  return was_paused;
}

bool EngineControl::flush_cache(bool torch_empty_cache) {
  std::function<void(bool)> f;
  {
    const std::lock_guard lock(mutex_);
    f = callbacks_.flush_cache;
  }
  if (!f) return false;
  call("flush_cache", [&] { f(torch_empty_cache); });
  return true;
}

void EngineControl::begin_update(const std::string& selector) {
  if (selector == "draft") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "begin_weight_update: selector 'draft': ferry holds no draft model (only the target; "
         "'target' and 'all' name it)");
  }
  if (selector != "target" && selector != "all") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "begin_weight_update: selector '{}' is not one of target, draft, all", selector);
  }
  const std::lock_guard lock(mutex_);
  if (state_.session_open) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "begin_weight_update: a weight-update session (selector '{}', {} updates) is already "
         "open; end_weight_update first",
         state_.selector, state_.updates_in_session);
  }
  state_.session_open = true;
  state_.selector = selector;
  state_.updates_in_session = 0;
}

void EngineControl::end_update() {
  std::function<void()> f;
  {
    const std::lock_guard lock(mutex_);
    if (!state_.session_open) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "end_weight_update: no weight-update session is open (begin_weight_update first)");
    }
    state_.session_open = false;
    state_.selector.clear();
    f = callbacks_.post_load;
  }
  if (f) call("post_load (at end_weight_update; the session is closed)", [&] { f(); });
}

EngineControl::State EngineControl::state() const {
  const std::lock_guard lock(mutex_);
  return state_;
}

void EngineControl::run_update(const UpdateEffects& effects, const std::function<void()>& update) {
  bool paused_here = false;
  if (effects.abort_all_requests) {
    const bool was_paused = state().paused;
    pause(PauseMode::abort);
    paused_here = !was_paused && !effects.keep_pause;
  }
  try {
    update();
  } catch (...) {
    // The update's own error is the answer; resuming must not hide it.
    if (paused_here) {
      try {
        resume(false);
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  std::function<void()> post_load;
  bool in_session = false;
  {
    const std::lock_guard lock(mutex_);
    in_session = state_.session_open;
    if (in_session) ++state_.updates_in_session;
    post_load = callbacks_.post_load;
  }
  try {
    if (!in_session && post_load) call("post_load", [&] { post_load(); });
    if (effects.flush_cache) flush_cache(effects.torch_empty_cache);
    if (paused_here) resume(false);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("the update committed, then {}", e.what()));
  }
}

std::vector<std::string> EngineControl::memory_tags() const {
  const std::lock_guard lock(mutex_);
  return callbacks_.memory ? callbacks_.memory_tags : std::vector<std::string>{};
}

void EngineControl::memory(const std::vector<std::string>& tags, bool release) {
  if (tags.empty()) return;
  std::function<void(const std::vector<std::string>&, bool)> f;
  {
    const std::lock_guard lock(mutex_);
    f = callbacks_.memory;
    for (const auto& t : tags) {
      if (!f || std::find(callbacks_.memory_tags.begin(), callbacks_.memory_tags.end(), t) ==
                    callbacks_.memory_tags.end()) {
        fail(FERRY_STATUS_NOT_FOUND, "memory tag '{}' is not one the engine registered", t);
      }
    }
  }
  call(release ? "release_memory" : "resume_memory", [&] { f(tags, release); });
}

}  // namespace ferry::receiver
