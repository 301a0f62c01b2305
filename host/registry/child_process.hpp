// registry/child_process.hpp: waiting for child processes that run untrusted plugin code, and
// saying what became of each: what it reported through its pipe, how it ended (exit status or
// signal), or that it ran past its deadline (then it is killed). Plugin vetting (a spawned helper)
// and the conformance suite (forked children) use it, so a plugin that crashes or hangs is
// named, never suffered.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ferry::registry {

// One running child: its pid, the read end of its report pipe and (or -1) of its stderr.
struct Child {
  pid_t pid = -1;
  int report_fd = -1;
  int output_fd = -1;
};

// How a child ended.
struct ChildEnd {
  std::string report;       // everything written to the report pipe
  std::string output_tail;  // the last bytes of its stderr/stdout (when captured)
  bool timed_out = false;   // still running at the deadline: killed with SIGKILL
  bool exited = false;      // exited by itself, with exit_code
  int exit_code = 0;
  int signal = 0;  // the signal that ended it (not SIGKILL sent for timed_out)
};

// "SIGSEGV (Segmentation fault)".
std::string signal_description(int signal);

// Reads every child's pipes until they reach end of file or `deadline` passes, kills the children
// still running then, and reaps them all. Closes the fds. One result per child, in order.
std::vector<ChildEnd> await_children(const std::vector<Child>& children,
                                     std::chrono::steady_clock::time_point deadline);

// The last line of `report` that starts with `prefix`, without the prefix ("" when none).
std::string last_line_with(const std::string& report, const std::string& prefix);

}  // namespace ferry::registry
