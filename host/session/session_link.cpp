// session/session_link.cpp: the state a session's thread shares with its endpoint's release hook
// (see session/session_link.hpp).
#include "session/session_link.hpp"

namespace ferry::session {

void SessionLink::set_rejoinable(bool rejoinable, bool rejoins_when_resumed) {
  std::lock_guard lock(mutex_);
  rejoinable_ = rejoinable;
  rejoins_when_resumed_ = rejoins_when_resumed;
}

void SessionLink::set_idle() {
  std::lock_guard lock(mutex_);
  idle_ = true;
}

bool SessionLink::leave_idle() {
  std::lock_guard lock(mutex_);
  idle_ = false;
  suspended_ = false;
  return !closing_ && !suspending_;
}

void SessionLink::set_suspended() {
  {
    std::lock_guard lock(mutex_);
    suspending_ = false;
    suspended_ = true;
  }
  changed_.notify_all();
}

bool SessionLink::suspending() {
  std::lock_guard lock(mutex_);
  return suspending_;
}

void SessionLink::set_ended() {
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
    idle_ = false;
  }
  changed_.notify_all();
}

void SessionLink::set_shares_nothing() {
  std::lock_guard lock(mutex_);
  shares_nothing_ = true;
}

bool SessionLink::shares_nothing() {
  std::lock_guard lock(mutex_);
  return shares_nothing_;
}

bool SessionLink::start_suspending() {
  std::lock_guard lock(mutex_);
  if (!idle_ || shares_nothing_ || !rejoinable_ || suspending_ || suspended_ || closing_ || ended_)
    return false;
  suspending_ = true;
  return true;
}

bool SessionLink::start_closing() {
  std::lock_guard lock(mutex_);
  // A suspended session shares nothing with its sender: it stays; so does one that reads in place.
  if (!idle_ || closing_ || ended_ || suspended_ || shares_nothing_) return false;
  closing_ = true;
  return true;
}

bool SessionLink::wait_suspended(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return suspended_ || ended_; });
}

bool SessionLink::wait_ended(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return ended_; });
}

}  // namespace ferry::session
