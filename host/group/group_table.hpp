// group/group_table.hpp: the lifecycle of named weight-update groups on one process: init, ready,
// failed, destroyed. A group is any type with `void abort(const std::string& reason) noexcept`
// (stops its communicator at once) and a destructor that frees it. Rules:
//  - init of a name whose group failed destroys the stale group (abort, then free) before the
//    new one is created: two communicators of one name never coexist;
//  - init of a name whose group is ready is refused (FAILED_PRECONDITION: destroy it first);
//  - an error in a ready group marks it failed (aborted at once) until it is destroyed or
//    re-initialised; using a failed group is refused with the failure's reason;
//  - destroy of an unknown name is NOT_FOUND.
// Threading: not thread-safe; the owner serializes calls (the receiver's update lock, the
// trainer's single thread).
#pragma once

#include <ferry/sdk/error.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace ferry::nccl {

enum class GroupState { ready, failed };

inline const char* group_state_name(GroupState s) {
  return s == GroupState::ready ? "ready" : "failed";
}

template <typename Group>
class GroupTable {
 public:
  // Creates group `name` with `make` (which may throw: then no group of that name remains).
  Group& init(const std::string& name, const std::function<std::unique_ptr<Group>()>& make) {
    auto it = slots_.find(name);
    if (it != slots_.end()) {
      if (it->second.state == GroupState::ready) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "weight-update group '{}' exists and is ready; destroy it before init", name);
      }
      // A stale group from a failure: its communicator goes first.
      it->second.group->abort("re-initialising group '" + name + "' after a failure");
      slots_.erase(it);
    }
    std::unique_ptr<Group> group = make();
    Group& ref = *group;
    slots_[name] = Slot{std::move(group), GroupState::ready, ""};
    return ref;
  }

  // The ready group `name`: NOT_FOUND when absent, FAILED_PRECONDITION naming the failure when
  // it failed.
  Group& ready(const std::string& name) {
    Slot& s = slot(name);
    if (s.state == GroupState::failed) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "weight-update group '{}' failed earlier ({}); destroy or re-init it", name, s.failure);
    }
    return *s.group;
  }

  // Marks `name` failed and aborts its communicator. No-op for an unknown name.
  void mark_failed(const std::string& name, const std::string& reason) noexcept {
    auto it = slots_.find(name);
    if (it == slots_.end() || it->second.state == GroupState::failed) return;
    it->second.group->abort(reason);
    it->second.state = GroupState::failed;
    try {
      it->second.failure = reason;
    } catch (...) {
      // The state says failed; the reason is only for messages.
    }
  }

  void destroy(const std::string& name) { take(name); }

  // Removes group `name` from the table and hands it over (with whether it was ready), so the
  // caller can close it with a deadline. NOT_FOUND for an unknown name.
  std::pair<std::unique_ptr<Group>, GroupState> take(const std::string& name) {
    auto it = slots_.find(name);
    if (it == slots_.end()) {
      fail(FERRY_STATUS_NOT_FOUND, "no weight-update group '{}'", name);
    }
    std::pair<std::unique_ptr<Group>, GroupState> out{std::move(it->second.group),
                                                      it->second.state};
    slots_.erase(it);
    return out;
  }

  bool contains(const std::string& name) const { return slots_.count(name) != 0; }
  GroupState state(const std::string& name) { return slot(name).state; }
  std::size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    std::unique_ptr<Group> group;
    GroupState state = GroupState::ready;
    std::string failure;
  };
  Slot& slot(const std::string& name) {
    auto it = slots_.find(name);
    if (it == slots_.end()) fail(FERRY_STATUS_NOT_FOUND, "no weight-update group '{}'", name);
    return it->second;
  }
  std::map<std::string, Slot> slots_;
};

}  // namespace ferry::nccl
