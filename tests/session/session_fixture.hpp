// tests/session/session_fixture.hpp: what the session tests share: tiny dense checkpoints of two
// versions, the fingerprints each receiver rank must report for them, `ferry push` as a child
// process, an in-process Sender over the same checkpoint, and bounded polling of a receiver.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "serve_fixture.hpp"
#include "session/sender/sender.hpp"

namespace ferry::test {

// Two versions of one tiny Qwen3-like model (every tensor F32, different random data), written
// as checkpoints v1/ and v2/ under a temporary folder.
struct TwoVersions {
  TwoVersions();
  TempDir dir;
  Checkpoint v1, v2;
  std::string v1_path() const { return (dir.path() / "v1").string(); }
  std::string v2_path() const { return (dir.path() / "v2").string(); }
};

// Fingerprint text (16 hex digits, as /get_fingerprints answers) of every parameter of `rank` of
// `size` in the engine layout.
std::map<std::string, std::string> expected_fingerprints(const Checkpoint& checkpoint,
                                                         unsigned rank, unsigned size);

// "127.0.0.1:PORT" of a serve process.
std::string address_of(const ServeProcess& serve);

// Options of a receiver for these tests: dense engine layout, short deadlines.
ServeOptions receiver_options(const std::string& model_path, unsigned tp_rank = 0,
                              unsigned tp_size = 1, std::uint64_t bucket_timeout_ms = 3000);

struct ChildResult {
  bool exited = false;  // false: killed by a signal (or still running when killed)
  int status = -1;      // exit code, or the signal number when !exited
  std::string output;   // stdout + stderr
};

// Runs FERRY_EXE with `args` (after the executable) and extra environment entries; waits up to
// `deadline_s`, then SIGKILLs it.
ChildResult run_ferry(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env = {}, double deadline_s = 60);

// A `ferry push` running in the background (for the sender-death tests).
class PushProcess {
 public:
  PushProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& env);
  ~PushProcess();
  pid_t pid() const { return pid_; }
  // Waits up to deadline_s for the process to end; false when it still runs.
  bool wait(double deadline_s, ChildResult& result);
  void kill_now();

 private:
  pid_t pid_ = -1;
  std::unique_ptr<TempDir> dir_;
  bool reaped_ = false;
};

// Views of every tensor of `checkpoint` (pointing into it) for an in-process Sender.
std::vector<session::TensorView> views_of(const Checkpoint& checkpoint);

// Polls `predicate` every 20 ms until it holds or `deadline_s` passes; returns its last value.
bool eventually(const std::function<bool()>& predicate, double deadline_s);

// The receiver's published version number (-1 when it does not answer).
long long version_of(const ServeProcess& serve);

// How many times `what` stands in `text` (a receiver's log).
std::size_t count_of(const std::string& text, const std::string& what);

}  // namespace ferry::test
