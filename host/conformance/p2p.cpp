// conformance/p2p.cpp: drives a loopback pair of point-to-point transport instances through the
// calls the host makes, in forked children with a watchdog per step (see p2p.hpp).
#include "conformance/p2p.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "conformance/tracking_host.hpp"
#include "registry/child_process.hpp"

namespace ferry::conformance {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::uint64_t kSlotBytes = 64 * 1024;
constexpr auto kGrace = 3s;              // past an operation's own deadline, before "hung"
constexpr auto kLongDeadline = 5s;       // for operations that should finish at once
constexpr auto kShortDeadline = 300ms;   // for operations that must time out
constexpr int kChurnThreads = 8;
constexpr int kPairThreads = 4;

std::int64_t deadline_ns(Clock::duration from_now) {
  // The host passes CLOCK_MONOTONIC nanoseconds (steady_clock on Linux).
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             (Clock::now() + from_now).time_since_epoch())
      .count();
}

// ---- the child's report ---------------------------------------------------------------------

// Writes "stage", "pass" and "fail" lines to the parent, and ends the child when a step outlives
// its limit (a hung plugin call: the parent then reports the step).
class Watchdog {
 public:
  explicit Watchdog(int fd) : fd_(fd), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // Starts a step that may take up to `limit`.
  void step(const std::string& what, Clock::duration limit) {
    std::lock_guard lock(mutex_);
    stage_ = what;
    limit_ = limit;
    due_ = Clock::now() + limit;
    write_line("stage " + what);
  }
  void finish(bool passed, const std::string& detail) {
    std::lock_guard lock(mutex_);
    write_line((passed ? "pass " : "fail ") + detail);
    stop_ = true;
    wake_.notify_all();
  }

 private:
  void write_line(std::string line) {
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    line += '\n';
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void watch() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (due_ != Clock::time_point{} && Clock::now() >= due_) {
        write_line(fmt::format("hung {:.1f} {}", std::chrono::duration<double>(limit_).count(),
                               stage_));
        ::_exit(3);
      }
      wake_.wait_for(lock, 20ms);
    }
  }

  int fd_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string stage_;
  Clock::duration limit_{};
  Clock::time_point due_{};
  std::thread thread_;
};

// ---- memory with guard pages ----------------------------------------------------------------

// `bytes` (a multiple of the page size) of read-write memory with a PROT_NONE page on each side.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(std::uint64_t bytes) : bytes_(bytes) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    total_ = bytes + 2 * page;
    void* map = ::mmap(nullptr, total_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail(FERRY_STATUS_OUT_OF_MEMORY, "mmap of {} bytes failed", total_);
    map_ = static_cast<std::uint8_t*>(map);
    if (::mprotect(map_ + page, bytes, PROT_READ | PROT_WRITE) != 0) {
      fail(FERRY_STATUS_INTERNAL, "mprotect failed");
    }
    data_ = map_ + page;
  }
  ~GuardedBuffer() { ::munmap(map_, total_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return bytes_; }
  void fill(std::uint8_t seed) {
    for (std::uint64_t i = 0; i < bytes_; ++i) data_[i] = static_cast<std::uint8_t>(seed + i * 7);
  }

 private:
  std::uint64_t bytes_;
  std::size_t total_ = 0;
  std::uint8_t* map_ = nullptr;
  std::uint8_t* data_ = nullptr;
};

// The first byte where `got` differs from `want`, as text; "" when equal.
std::string first_difference(const std::uint8_t* got, const std::uint8_t* want, std::uint64_t n,
                             std::uint64_t base_offset) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      return fmt::format("byte {} is {:#04x}, expected {:#04x}", base_offset + i, got[i],
                         want[i]);
    }
  }
  return {};
}

// ---- one instance and one loopback pair -----------------------------------------------------

std::vector<std::uint8_t> take_blob(ferry_blob_t& blob) {
  std::vector<std::uint8_t> bytes;
  if (blob.data != nullptr && blob.size > 0) bytes.assign(blob.data, blob.data + blob.size);
  if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
  blob = ferry_blob_t{};
  return bytes;
}

ferry_blob_t borrow(const std::vector<std::uint8_t>& bytes) {
  ferry_blob_t b{};
  b.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  b.data = bytes.data();
  b.size = bytes.size();
  return b;
}

// Throws ferry::Error naming `call` when `error` is set (taking it).
void check(ferry_error_t* error, const std::string& call) {
  if (error == nullptr) return;
  const ErrorSeen seen = take_error(error);
  if (!seen.made_by_host) fail(FERRY_STATUS_INTERNAL, "{} failed with an error not made by the host", call);
  fail(seen.code, "{} failed: {} ({})", call, seen.message, status_name(seen.code));
}

class Side {
 public:
  Side(const ferry_transport_api_t& api, ferry_role_t role) : api_(api), role_(role) {
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = role;
    args.device = -1;
    check(api_.create(&args, &t_), fmt::format("create ({})", who()));
    if (t_ == nullptr) fail(FERRY_STATUS_INTERNAL, "create ({}) returned no instance", who());
  }
  ~Side() {
    if (peer_ != nullptr) api_.disconnect(t_, peer_);
    for (auto* m : memory_) api_.deregister_memory(t_, m);
    api_.destroy(t_);
  }
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  const char* who() const { return role_ == FERRY_ROLE_SENDER ? "sender" : "receiver"; }
  ferry_transport_t* t() const { return t_; }
  ferry_peer_t* peer() const { return peer_; }

  std::vector<std::uint8_t> address() {
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    check(api_.get_address(t_, &blob), fmt::format("get_address ({})", who()));
    return take_blob(blob);
  }
  void connect(const std::vector<std::uint8_t>& remote) {
    ferry_blob_t blob = borrow(remote);
    ferry_connect_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    args.remote_addresses = &blob;
    args.num_remote = 1;
    args.local_rank = role_ == FERRY_ROLE_SENDER ? 0 : 1;
    args.group_size = 2;
    args.peer_name = role_ == FERRY_ROLE_SENDER ? "conformance receiver" : "conformance sender";
    args.deadline_ns = deadline_ns(kLongDeadline);
    check(api_.connect(t_, &args, &peer_), fmt::format("connect ({})", who()));
  }
  ferry_memory_t* add(const GuardedBuffer& buffer) {
    ferry_memory_desc_t desc{};
    desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
    desc.base = buffer.data();
    desc.size = buffer.size();
    desc.kind = FERRY_MEMORY_HOST;
    desc.device = -1;
    ferry_memory_t* m = nullptr;
    check(api_.register_memory(t_, &desc, &m), fmt::format("register_memory ({})", who()));
    memory_.push_back(m);
    return m;
  }
  // Waits for and frees `request` (NULL: complete); the request's error, if any.
  ErrorSeen finish(ferry_request_t* request, Clock::duration within) {
    ErrorSeen seen;
    if (request == nullptr) return seen;
    ferry_error_t* error = nullptr;
    if (api_.request_wait != nullptr) {
      error = api_.request_wait(t_, request, deadline_ns(within));
    } else if (api_.request_test != nullptr) {
      const auto until = Clock::now() + within;
      int done = 0;
      while (error == nullptr && !done && Clock::now() < until) {
        error = api_.request_test(t_, request, &done);
        if (!done) std::this_thread::sleep_for(100us);
      }
    }
    if (error != nullptr) seen = take_error(error);
    if (api_.request_free != nullptr) api_.request_free(t_, request);
    return seen;
  }

 private:
  const ferry_transport_api_t& api_;
  ferry_role_t role_;
  ferry_transport_t* t_ = nullptr;
  ferry_peer_t* peer_ = nullptr;
  std::vector<ferry_memory_t*> memory_;
};

ferry_memory_range_t range_of(ferry_memory_t* m, std::uint64_t offset, std::uint64_t size) {
  ferry_memory_range_t r{};
  r.struct_size = FERRY_STRUCT_SIZE(ferry_memory_range_t, size);
  r.memory = m;
  r.offset = offset;
  r.size = size;
  return r;
}

// A sender and a receiver connected in the host's order: the sender's address first, the
// receiver registers its slots and connects, then the sender connects to the receiver.
struct Pair {
  Pair(const ferry_transport_api_t& api, const ferry_transport_caps_t& caps)
      : api(api), caps(caps), sender(api, FERRY_ROLE_SENDER), receiver(api, FERRY_ROLE_RECEIVER),
        slot(kSlotBytes), local(kSlotBytes) {
    const auto sender_address = sender.address();
    slot_memory = receiver.add(slot);
    receiver.connect(sender_address);
    const auto receiver_address = receiver.address();
    sender.connect(receiver_address);
    local_memory = sender.add(local);
  }

  bool can_put() const {
    return (caps.flags & FERRY_TRANSPORT_CAP_DIRECT_WRITE) != 0 && api.put != nullptr &&
           api.flush != nullptr && api.pack_key != nullptr;
  }
  bool can_send() const { return api.send_bucket != nullptr && api.recv_bucket != nullptr; }

  // put of local[from, from+n) to slot[to, to+n), then flush. false when the transport answered
  // UNIMPLEMENTED for this peer (the host then sends instead).
  // `dog`, when given, watches the flush as a step of its own.
  bool put_and_flush(std::uint64_t from, std::uint64_t to, std::uint64_t n,
                     Watchdog* dog = nullptr) {
    if (key.empty()) {
      ferry_blob_t blob{};
      blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
      check(api.pack_key(receiver.t(), slot_memory, &blob), "pack_key (receiver)");
      key = take_blob(blob);
    }
    ferry_blob_t remote = borrow(key);
    ferry_put_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
    args.local = range_of(local_memory, from, n);
    args.remote_key = &remote;
    args.remote_offset = to;
    args.deadline_ns = deadline_ns(kLongDeadline);
    ferry_request_t* request = nullptr;
    ferry_error_t* error = api.put(sender.t(), sender.peer(), &args, &request);
    if (error != nullptr) {
      const ErrorSeen seen = take_error(error);
      if (seen.code == FERRY_STATUS_UNIMPLEMENTED) return false;
      fail(seen.code, "put failed: {} ({})", seen.message, status_name(seen.code));
    }
    expect_ok(sender.finish(request, kLongDeadline), "put");
    if (dog != nullptr) {
      dog->step(fmt::format("flush after a put of {} bytes (deadline {} s away)", n,
                            std::chrono::duration<double>(kLongDeadline).count()),
                kLongDeadline + kGrace);
    }
    flush(kLongDeadline);
    return true;
  }
  void flush(Clock::duration within) {
    ferry_request_t* request = nullptr;
    check(api.flush(sender.t(), sender.peer(), deadline_ns(within), &request), "flush");
    expect_ok(sender.finish(request, within), "flush");
  }
  static void expect_ok(const ErrorSeen& seen, const char* what) {
    if (seen.code != FERRY_STATUS_OK) {
      fail(seen.code, "{} completed with {}: {}", what, status_name(seen.code), seen.message);
    }
  }

  // One recv_bucket into the whole slot with nothing sent for it, waited for up to `wait`; how it
  // ended.
  ErrorSeen receive_unsent(Clock::duration deadline, Clock::duration wait) {
    ferry_bucket_io_t io{};
    io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
    io.data = range_of(slot_memory, 0, kSlotBytes);
    io.bucket_index = 1;
    io.deadline_ns = deadline_ns(deadline);
    ferry_request_t* request = nullptr;
    ferry_error_t* error = api.recv_bucket(receiver.t(), receiver.peer(), &io, &request);
    return error != nullptr ? take_error(error) : receiver.finish(request, wait);
  }

  // recv_bucket into slot[0, n) on its own thread (a synchronous transport blocks in it), then
  // send_bucket of local[0, n); the receive's outcome.
  ErrorSeen send_into_posted_receive(std::uint64_t n, std::uint32_t index) {
    ErrorSeen received;
    std::string receive_failure;
    std::thread receiving([&] {
      try {
        ferry_bucket_io_t io{};
        io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
        io.data = range_of(slot_memory, 0, slot.size());
        io.bucket_index = index;
        io.deadline_ns = deadline_ns(kLongDeadline);
        ferry_request_t* request = nullptr;
        ferry_error_t* error = api.recv_bucket(receiver.t(), receiver.peer(), &io, &request);
        received = error != nullptr ? take_error(error) : receiver.finish(request, kLongDeadline);
      } catch (const std::exception& e) {
        receive_failure = e.what();
      }
    });
    std::this_thread::sleep_for(20ms);  // posted first, as the host does
    std::string send_failure;
    try {
      ferry_bucket_io_t io{};
      io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
      io.data = range_of(local_memory, 0, n);
      io.bucket_index = index;
      io.deadline_ns = deadline_ns(kLongDeadline);
      ferry_request_t* request = nullptr;
      check(api.send_bucket(sender.t(), sender.peer(), &io, &request), "send_bucket");
      expect_ok(sender.finish(request, kLongDeadline), "send_bucket");
    } catch (const std::exception& e) {
      send_failure = e.what();
    }
    receiving.join();
    if (!send_failure.empty()) fail(FERRY_STATUS_INTERNAL, "{}", send_failure);
    if (!receive_failure.empty()) fail(FERRY_STATUS_INTERNAL, "{}", receive_failure);
    return received;
  }

  // Moves one bucket of `n` bytes by whichever way the transport has (send first, as the host's
  // fallback, else put); fails when it did not arrive intact.
  void move_bucket(std::uint64_t n, std::uint8_t seed, std::uint32_t index) {
    local.fill(seed);
    std::memset(slot.data(), 0, slot.size());
    if (can_send()) {
      expect_ok(send_into_posted_receive(n, index), "recv_bucket");
    } else if (!put_and_flush(0, 0, n)) {
      fail(FERRY_STATUS_UNIMPLEMENTED, "put answered UNIMPLEMENTED and there is no send_bucket");
    }
    if (auto diff = first_difference(slot.data(), local.data(), n, 0); !diff.empty()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "bucket {} arrived wrong: {}", index, diff);
    }
  }

  const ferry_transport_api_t& api;
  const ferry_transport_caps_t& caps;
  Side sender;
  Side receiver;
  GuardedBuffer slot;   // the receiver's registered slot
  GuardedBuffer local;  // the sender's registered source
  ferry_memory_t* slot_memory = nullptr;
  ferry_memory_t* local_memory = nullptr;
  std::vector<std::uint8_t> key;
};

// ---- the requirements -----------------------------------------------------------------------

// FERRY-ABI-12.
std::string check_data(const ferry_transport_api_t& api, const ferry_transport_caps_t& caps,
                       Watchdog& dog) {
  dog.step("create a sender and a receiver, connect the receiver to the sender first, then "
           "the sender to the receiver (as the host does)",
           kLongDeadline + kGrace);
  Pair pair(api, caps);
  std::vector<std::string> did;
  bool moved = false;
  if (pair.can_put()) {
    dog.step(fmt::format("put of {} bytes into the receiver's whole registered range (guard "
                         "pages around it)",
                         kSlotBytes),
             kLongDeadline + kGrace);
    pair.local.fill(0x11);
    std::memset(pair.slot.data(), 0, pair.slot.size());
    if (pair.put_and_flush(0, 0, kSlotBytes, &dog)) {
      if (auto diff = first_difference(pair.slot.data(), pair.local.data(), kSlotBytes, 0);
          !diff.empty()) {
        fail(FERRY_STATUS_CORRUPT_DATA, "after put + flush of the whole range, {}", diff);
      }
      dog.step("put of 4096 bytes from source offset 4096 to offset 8192",
               kLongDeadline + kGrace);
      std::vector<std::uint8_t> want(pair.slot.data(), pair.slot.data() + kSlotBytes);
      pair.local.fill(0x5A);
      std::memcpy(want.data() + 8192, pair.local.data() + 4096, 4096);
      pair.put_and_flush(4096, 8192, 4096, &dog);
      if (auto diff = first_difference(pair.slot.data(), want.data(), kSlotBytes, 0);
          !diff.empty()) {
        fail(FERRY_STATUS_CORRUPT_DATA, "after a put of [4096, +4096) to offset 8192, {}", diff);
      }
      did.push_back("put + flush (whole range and at an offset)");
      moved = true;
    } else {
      did.push_back("put answered UNIMPLEMENTED for this peer (the host sends instead)");
    }
  }
  if (pair.can_send()) {
    dog.step("recv_bucket posted into a 65536-byte slot, then send_bucket of 40000 bytes",
             2 * kLongDeadline + kGrace);
    pair.local.fill(0x33);
    std::memset(pair.slot.data(), 0xEE, pair.slot.size());
    Pair::expect_ok(pair.send_into_posted_receive(40000, 7), "recv_bucket");
    if (auto diff = first_difference(pair.slot.data(), pair.local.data(), 40000, 0);
        !diff.empty()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "after send into a posted receive, {}", diff);
    }
    for (std::uint64_t i = 40000; i < kSlotBytes; ++i) {
      if (pair.slot.data()[i] != 0xEE) {
        fail(FERRY_STATUS_CORRUPT_DATA,
             "a 40000-byte bucket wrote byte {} of the receive range, past the bucket", i);
      }
    }
    did.push_back("send_bucket into a posted recv_bucket");
    moved = true;
  }
  if (!moved) {
    fail(FERRY_STATUS_UNIMPLEMENTED,
         "moves no bytes: neither put + flush nor send_bucket + recv_bucket worked");
  }
  dog.step("disconnect, deregister_memory and destroy both instances", kLongDeadline);
  std::string text;
  for (const auto& d : did) text += (text.empty() ? "" : "; ") + d;
  return text + ": the bytes arrived exactly, nothing outside the ranges was touched";
}

// FERRY-ABI-13.
std::string check_deadlines(const ferry_transport_api_t& api, const ferry_transport_caps_t& caps,
                            Watchdog& dog) {
  dog.step("connect a loopback pair", kLongDeadline + kGrace);
  Pair pair(api, caps);
  std::vector<std::string> did;
  if (pair.can_put()) {
    dog.step("flush with nothing outstanding (deadline 300 ms away)", kShortDeadline + kGrace);
    pair.flush(kShortDeadline);
    did.push_back("an idle flush completes");
  }
  if (api.recv_bucket != nullptr) {
    dog.step("recv_bucket with nothing sent (deadline 300 ms away): TIMEOUT by then",
             kShortDeadline + kGrace);
    const auto start = Clock::now();
    const ErrorSeen seen = pair.receive_unsent(kShortDeadline, kShortDeadline);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (seen.code != FERRY_STATUS_TIMEOUT) {
      fail(FERRY_STATUS_INTERNAL, "a receive with nothing sent ended with {} ({}), not TIMEOUT",
           status_name(seen.code), seen.message);
    }
    did.push_back(fmt::format("an unanswered receive times out ({:.2f} s)", took));
  }
  if (api.abort != nullptr && api.recv_bucket != nullptr) {
    dog.step("abort from another thread while a receive waits (deadline 10 s away): ABORTED "
             "within 3 s",
             3s + kGrace);
    Pair fresh(api, caps);
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);
      api.abort(fresh.receiver.t(), "conformance: abort");
    });
    const auto start = Clock::now();
    const ErrorSeen seen = fresh.receive_unsent(kLongDeadline, 3s);
    aborter.join();
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (seen.code != FERRY_STATUS_ABORTED) {
      fail(FERRY_STATUS_INTERNAL, "a receive aborted from another thread ended with {} ({}) "
           "after {:.2f} s, not ABORTED", status_name(seen.code), seen.message, took);
    }
    did.push_back(fmt::format("abort ends a waiting receive ({:.2f} s)", took));
  }
  dog.step("disconnect and destroy", kLongDeadline);
  if (did.empty()) return "no deadline to check (no flush, no recv_bucket)";
  std::string text;
  for (const auto& d : did) text += (text.empty() ? "" : "; ") + d;
  return text;
}

// FERRY-ABI-14.
std::string check_threads(const ferry_transport_api_t& api, const ferry_transport_caps_t& caps,
                          Watchdog& dog) {
  dog.step(fmt::format("create and destroy instances on {} threads at once", kChurnThreads),
           5s + kGrace);
  std::atomic<int> rounds{0};
  std::mutex failure_mutex;
  std::string failure;
  auto record = [&](const std::string& text) {
    std::lock_guard lock(failure_mutex);
    if (failure.empty()) failure = text;
  };
  {
    const auto until = Clock::now() + 1s;
    std::vector<std::thread> threads;
    for (int i = 0; i < kChurnThreads; ++i) {
      threads.emplace_back([&, i] {
        try {
          int mine = 0;
          while (mine == 0 || Clock::now() < until) {
            Side side(api, i % 2 == 0 ? FERRY_ROLE_SENDER : FERRY_ROLE_RECEIVER);
            (void)side.address();
            ++mine;
          }
          rounds += mine;
        } catch (const std::exception& e) {
          record(e.what());
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  if (!failure.empty()) {
    fail(FERRY_STATUS_INTERNAL, "creating and destroying on {} threads at once: {}",
         kChurnThreads, failure);
  }
  dog.step(fmt::format("{} loopback pairs moving 10 buckets each at once, one thread each",
                       kPairThreads),
           2 * kLongDeadline + kGrace);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kPairThreads; ++i) {
      threads.emplace_back([&, i] {
        try {
          Pair pair(api, caps);
          for (std::uint32_t b = 0; b < 10; ++b) {
            pair.move_bucket(kSlotBytes / 2, static_cast<std::uint8_t>(i * 16 + b), b);
          }
        } catch (const std::exception& e) {
          record(fmt::format("pair {}: {}", i, e.what()));
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  if (!failure.empty()) {
    fail(FERRY_STATUS_INTERNAL, "{} pairs at once: {}", kPairThreads, failure);
  }
  return fmt::format("{} instances created and destroyed on {} threads; {} pairs moved 10 "
                     "buckets each at once, every one to its own receiver",
                     rounds.load(), kChurnThreads, kPairThreads);
}

using Check = std::string (*)(const ferry_transport_api_t&, const ferry_transport_caps_t&,
                              Watchdog&);

// Runs `check` in a forked child and turns what the child reported, or how it ended, into the
// result.
Result run_in_child(const char* id, Check check, const ferry_transport_api_t& api,
                    const ferry_transport_caps_t& caps) {
  Result result;
  result.id = id;
  result.outcome = Outcome::kFail;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.detail = "cannot make a pipe for the child";
    return result;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    result.detail = "cannot fork a child to run the check in";
    return result;
  }
  if (pid == 0) {
    ::close(fds[0]);
    {
      Watchdog dog(fds[1]);
      try {
        dog.finish(true, check(api, caps, dog));
      } catch (const std::exception& e) {
        dog.finish(false, e.what());
      }
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  // A backstop in case the child's watchdog cannot run: the longest step is well within this.
  const auto ends = registry::await_children({{pid, fds[0], -1}}, Clock::now() + 90s);
  const registry::ChildEnd& end = ends.front();
  const std::string passed = registry::last_line_with(end.report, "pass ");
  const std::string failed = registry::last_line_with(end.report, "fail ");
  const std::string hung = registry::last_line_with(end.report, "hung ");
  const std::string stage = registry::last_line_with(end.report, "stage ");
  if (!failed.empty()) {
    result.detail = failed + " (during: " + stage + ")";
  } else if (!passed.empty()) {
    result.outcome = Outcome::kPass;
    result.detail = passed;
  } else if (!hung.empty()) {
    const auto space = hung.find(' ');
    result.detail = fmt::format("did not return within {} s: {}", hung.substr(0, space),
                                hung.substr(space + 1));
  } else if (end.timed_out) {
    result.detail = "the child running the check did not finish within 90 s during: " + stage;
  } else if (end.signal != 0) {
    const bool moving = stage.find("put") != std::string::npos ||
                        stage.find("recv_bucket") != std::string::npos;
    result.detail = fmt::format("crashed with {} during: {} (run in a child process{})",
                                registry::signal_description(end.signal), stage,
                                moving ? "; guard pages surround every registered range, so a "
                                         "write or read outside one faults"
                                       : "");
  } else {
    result.detail = fmt::format("the child ended with exit status {} during: {}", end.exit_code,
                                stage);
  }
  return result;
}

}  // namespace

std::vector<Result> run_point_to_point(const ferry_transport_api_t& api,
                                       const ferry_transport_caps_t& caps) {
  return {run_in_child(kPointToPointIds[0], check_data, api, caps),
          run_in_child(kPointToPointIds[1], check_deadlines, api, caps),
          run_in_child(kPointToPointIds[2], check_threads, api, caps)};
}

}  // namespace ferry::conformance
