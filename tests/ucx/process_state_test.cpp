// tests/ucx/process_state_test.cpp: the UCX plugin's same-host liveness check
// (plugins/ucx/process_state.hpp): running, zombie and reaped processes, and a reader racing the
// reap of hundreds of exiting children. The race once threw out of the plugin's progress thread
// (std::terminate in ucx_transport under ASan); here a throw would fail the noexcept call the
// same way, so the test fails if it comes back.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "plugins/ucx/process_state.hpp"

namespace ferry::ucx {
namespace {

pid_t exiting_child() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  return pid;
}

void reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

TEST(ProcessGone, RunningProcessIsNotGone) {
  EXPECT_FALSE(process_gone(static_cast<std::uint32_t>(getpid())));
  EXPECT_FALSE(process_gone(1));
}

TEST(ProcessGone, ZombieAndReapedChildrenAreGone) {
  const pid_t pid = exiting_child();
  ASSERT_GT(pid, 0);
  // Exited, not yet reaped: a zombie.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(process_gone(static_cast<std::uint32_t>(pid)));
  reap(pid);
  EXPECT_TRUE(process_gone(static_cast<std::uint32_t>(pid)));
}

TEST(ProcessGone, NoSuchPidIsGone) {
  // Above the kernel's pid limit (4194304 at most): never a process.
  EXPECT_TRUE(process_gone(0x7fffffffu));
}

// A reader polls a child's state while the child exits and is reaped: the read of /proc/PID/stat
// then fails with ESRCH after a successful open. The old std::ifstream version threw here in
// ~4% of the children on the CPU machine.
TEST(ProcessGone, ReaderRacingTheReapAnswersGone) {
  constexpr int kChildren = 500;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = exiting_child();
    ASSERT_GT(pid, 0);
    std::atomic<bool> reaped{false};
    bool gone_after_reap = false;
    std::thread reader([&] {
      for (;;) {
        const bool after = reaped.load();
        const bool gone = process_gone(static_cast<std::uint32_t>(pid));
        if (after) {
          gone_after_reap = gone;
          return;
        }
      }
    });
    reap(pid);
    reaped.store(true);
    reader.join();
    ASSERT_TRUE(gone_after_reap) << "child " << i << " (pid " << pid << ") reaped but not gone";
  }
}

}  // namespace
}  // namespace ferry::ucx
