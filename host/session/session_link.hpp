// session/session_link.hpp: one receiver session connection as its endpoint sees it, shared
// between the session's thread and the threads that may suspend or end it (a release of the
// receiver's memory). A kept session between updates is idle: it holds no update lock, but it may
// share memory with its sender. A release either suspends it (its sender rejoins after the
// resume: Hello.rejoinAfterRelease) or closes it (docs/session-protocol.md, "Kept sessions"),
// unless it shares nothing (it reads its sender's tensors in place): that one stays as it is.
//
//   idle --start_suspending--> suspending --set_suspended--> suspended --leave_idle--> busy
//   (suspended: tell_resumed() when the memory is back; the sender then rejoins: leave_idle)
//   idle --start_closing--> closing --(session ends)--> ended
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace ferry::session {

class SessionLink {
 public:
  // ---- the session's thread
  // After the handshake: whether the sender rejoins a suspended session (its Hello said so), and
  // whether it takes the word that the memory is back (Message.resumed) to rejoin at once.
  void set_rejoinable(bool rejoinable, bool rejoins_when_resumed = false);
  // Between updates. leave_idle() takes the session back for an update; false once closing or
  // suspending was asked for (the message that woke the session crossed the Closing: it ends).
  void set_idle();
  bool leave_idle();
  // A suspending session's data path is gone (its sender's, then its own): the memory may go.
  // The session stays idle.
  void set_suspended();
  // True while suspending was asked for and the session has not dropped its data path yet.
  bool suspending();
  // A kept session that reads its sender's tensors in place and let its staging slots go holds
  // nothing of this receiver's memory, and its sender maps none: a release neither suspends nor
  // closes it (its next update's Begin finds the memory resumed, or fails naming the released tag).
  void set_shares_nothing();
  void set_ended();

  // ---- any thread (the release hook)
  bool shares_nothing();
  // Makes an idle, rejoinable session that shares something suspending; true when this call did
  // (the caller then sends the Closing with `suspend`). A suspended session shares nothing.
  bool start_suspending();
  // Makes an idle session that shares something closing; true when this call did (the caller
  // then sends the Closing). A closing session takes no further update.
  bool start_closing();
  // The receiver's memory is back: calls `tell` (which sends the sender a `resumed`) when the
  // session is suspended and its sender takes that word, under the link's lock, so that the
  // message goes before anything the session's thread sends once it leaves the suspension.
  // True when it did.
  template <typename Tell>
  bool tell_resumed(Tell tell) {
    std::lock_guard lock(mutex_);
    if (!suspended_ || !idle_ || !rejoins_when_resumed_ || closing_ || ended_) return false;
    tell();
    return true;
  }
  // Until the session is suspended or ended; false at the deadline.
  bool wait_suspended(std::chrono::steady_clock::time_point deadline);
  // Until the session ended (its data path gone, its sender disconnected); false at the deadline.
  bool wait_ended(std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool rejoinable_ = false;
  bool rejoins_when_resumed_ = false;
  bool idle_ = false;
  bool suspending_ = false;
  bool suspended_ = false;
  bool shares_nothing_ = false;
  bool closing_ = false;
  bool ended_ = false;
};

}  // namespace ferry::session
