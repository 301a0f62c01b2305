// Pushes over cuda_ipc between two processes on one GPU: this process is the trainer (its
// tensors in its own device memory, pushed by an in-process session::Sender), the receiver is a
// real `ferry serve --device cuda:0` child. Checked: bit-identical round trips with 1, 256 and
// 4096 tensors and for the tiny dense checkpoint; 100 consecutive updates grow neither open
// fds, nor mapped memory (/proc/<pid>/maps lines) in either process, nor used device memory; a
// sender killed (SIGKILL) mid-update makes the receiver abort within its deadline with its
// version and weights unchanged; a receiver killed mid-update is reported by its address and a
// restarted receiver imports afresh and commits. The round trips run in both delivery modes:
// direct (the sender writes each tensor straight into the receiver's parameters) and staged
// (through the receiver's device slots); a sender killed while writing in place leaves the
// receiver rolled back. Sessions are kept between pushes: a release of the receiver's memory
// suspends the kept session first (the sender unmaps), the memory is free when it returns, and
// the next push rejoins the session; a hundred release/resume/push cycles grow nothing. Two
// sharded ranks write their row blocks in place, bit-identical; one killed while writing leaves
// the receiver rolled back to its version, the other rank's report naming it. Exits 77
// (skip) without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <ferry/kernels/cpu.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session_fixture.hpp"
#include "slow_write.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Tensors in this process's device memory (one cudaMalloc, 256-byte aligned, like a trainer's
// flattened parameters) with a host copy of their bytes for the expected fingerprints. Sizes
// differ per tensor (not multiples of 256) so that bucket offsets and padding are exercised.
class DeviceTensors {
 public:
  DeviceTensors(std::size_t count, std::uint64_t base_elements) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      Item it;
      it.name = fmt::format("model.layers.{}.weight", i);
      it.elements = base_elements + 3 * (i % 97);
      it.offset = total;
      total += (it.elements * 4 + 255) / 256 * 256;
      items_.push_back(it);
    }
    bytes_ = total;
    if (cudaMalloc(&base_, total) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  ~DeviceTensors() { (void)cudaFree(base_); }
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  // New random F32 contents for every tensor (complete on the device when it returns).
  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    host_.assign(bytes_, std::byte{0});
    for (auto& it : items_) {
      auto* p = reinterpret_cast<float*>(host_.data() + it.offset);
      std::normal_distribution<float> d(0.f, 1.f);
      for (std::uint64_t e = 0; e < it.elements; ++e) p[e] = d(rng);
    }
    if (cudaMemcpy(base_, host_.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
  }

  std::vector<session::TensorView> views() const {
    std::vector<session::TensorView> out;
    for (const auto& it : items_) {
      out.push_back({it.name, FERRY_DTYPE_F32, {it.elements},
                     static_cast<const std::byte*>(base_) + it.offset, FERRY_MEMORY_CUDA, 0});
    }
    return out;
  }

  // Parameter name -> fingerprint text, as /get_fingerprints answers (identity layout).
  std::map<std::string, std::string> expected() const {
    std::map<std::string, std::string> out;
    for (const auto& it : items_) {
      out[it.name] = fmt::format(
          "{:016x}", kernels::fingerprint_cpu(host_.data() + it.offset, it.elements * 4, 1));
    }
    return out;
  }
  std::uint64_t payload() const {
    std::uint64_t n = 0;
    for (const auto& it : items_) n += it.elements * 4;
    return n;
  }

  // Queues on `stream` "an optimizer step" that writes `next`'s contents into these tensors after
  // `wait_ms` of GPU time (the layouts must be equal); expected() describes them from now on.
  cudaError_t queue_update_from(const DeviceTensors& next, unsigned wait_ms, cudaStream_t stream) {
    host_ = next.host_;
    return enqueue_slow_copy(next.base_, base_, bytes_, wait_ms, stream);
  }

 private:
  struct Item {
    std::string name;
    std::uint64_t elements = 0;
    std::uint64_t offset = 0;
  };
  std::vector<Item> items_;
  void* base_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::vector<std::byte> host_;
};

// A checkpoint's tensors copied to this process's GPU.
class DeviceCheckpoint {
 public:
  explicit DeviceCheckpoint(const Checkpoint& c) {
    for (const auto& t : c.tensors) {
      void* p = nullptr;
      if (cudaMalloc(&p, std::max<std::size_t>(t.bytes.size(), 1)) != cudaSuccess ||
          cudaMemcpy(p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
        throw std::runtime_error("cudaMalloc/cudaMemcpy");
      }
      memory_.push_back(p);
      views_.push_back({t.name, t.dtype, t.shape, p, FERRY_MEMORY_CUDA, 0});
    }
  }
  ~DeviceCheckpoint() {
    for (void* p : memory_) (void)cudaFree(p);
  }
  DeviceCheckpoint(const DeviceCheckpoint&) = delete;
  DeviceCheckpoint& operator=(const DeviceCheckpoint&) = delete;
  const std::vector<session::TensorView>& views() const { return views_; }

 private:
  std::vector<void*> memory_;
  std::vector<session::TensorView> views_;
};

// A GPU receiver: `ferry serve --device cuda:0`, an identity layout made by the first session
// (model_path empty) or the dense checkpoint at `model_path`.
ServeOptions gpu_receiver(const std::string& model_path = "",
                          std::uint64_t bucket_timeout_ms = 5000) {
  ServeOptions o = receiver_options(model_path, 0, 1, bucket_timeout_ms);
  o.model_family = model_path.empty() ? "identity" : "dense";
  o.sets.push_back("receiver.device=cuda:0");
  return o;
}

fs::path plugin_dir() {
  const char* path = std::getenv("FERRY_CUDA_IPC_PLUGIN");
  if (path == nullptr) throw std::runtime_error("set FERRY_CUDA_IPC_PLUGIN");
  return fs::path(path).parent_path();
}

session::SenderOptions sender_options(const std::vector<std::string>& receivers,
                                      std::uint64_t bucket_bytes) {
  session::SenderOptions o;
  o.receivers = receivers;
  o.transport = "cuda_ipc";
  o.bucket_bytes = bucket_bytes;
  o.bucket_timeout = std::chrono::milliseconds(20000);
  o.commit_timeout = std::chrono::milliseconds(20000);
  // Direct delivery copies (and fingerprints) groups of several buckets per flush; small groups
  // here, so that groups are pipelined as with gigabytes.
  o.fingerprinted_group_bytes = 5ull << 20;
  return o;
}

std::size_t count_entries(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

std::size_t count_lines(const fs::path& file) {
  std::ifstream in(file);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// `count()` once it equals `baseline`, or its last value after ~5 s: a push's data paths are
// torn down on threads of their own after the push returns (stacks, guard pages, the plugin
// instance), so a sample taken at once can count transient mappings. Real growth over 100 updates does not
// settle and still fails.
template <typename Value, typename Count>
Value settled(Value baseline, Count count) {
  Value now = count();
  for (int i = 0; i < 50 && now != baseline; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = count();
  }
  return now;
}

// The mappings of a process without their addresses ("perms size path"), to name what grew.
std::multiset<std::string> mapping_kinds(const fs::path& maps) {
  std::multiset<std::string> out;
  std::ifstream in(maps);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode;
    std::getline(fields, path);
    const auto dash = range.find('-');
    const auto size = std::stoull(range.substr(dash + 1), nullptr, 16) -
                      std::stoull(range.substr(0, dash), nullptr, 16);
    out.insert(fmt::format("{} {} {}", perms, size, path.empty() ? "[anon]" : path));
  }
  return out;
}

// The mappings in `after` that `before` did not have (at most 20), one per line.
std::string new_mappings(const std::multiset<std::string>& before,
                         const std::multiset<std::string>& after) {
  std::vector<std::string> added;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(added));
  std::string text;
  for (std::size_t i = 0; i < added.size() && i < 20; ++i) text += "\n  " + added[i];
  return text;
}

std::uint64_t device_used() {
  std::size_t free = 0;
  std::size_t total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return total - free;
}

// What this process and the receiver child hold: open fds, mappings (and what they are), and
// the GPU's used memory; expect_unchanged() fails naming what grew since it was taken.
struct Footprint {
  explicit Footprint(pid_t receiver)
      : receiver_proc(fs::path("/proc") / std::to_string(receiver)),
        fds(count_entries("/proc/self/fd")),
        maps(count_lines("/proc/self/maps")),
        receiver_fds(count_entries(receiver_proc / "fd")),
        receiver_maps(count_lines(receiver_proc / "maps")),
        maps_kinds(mapping_kinds("/proc/self/maps")),
        receiver_maps_kinds(mapping_kinds(receiver_proc / "maps")),
        used(device_used()) {}

  void expect_unchanged() const {
    EXPECT_EQ(settled(fds, [] { return count_entries("/proc/self/fd"); }), fds);
    EXPECT_EQ(settled(maps, [] { return count_lines("/proc/self/maps"); }), maps)
        << "new mappings:" << new_mappings(maps_kinds, mapping_kinds("/proc/self/maps"));
    EXPECT_EQ(settled(receiver_fds, [&] { return count_entries(receiver_proc / "fd"); }),
              receiver_fds);
    EXPECT_EQ(settled(receiver_maps, [&] { return count_lines(receiver_proc / "maps"); }),
              receiver_maps)
        << "new mappings:"
        << new_mappings(receiver_maps_kinds, mapping_kinds(receiver_proc / "maps"));
    EXPECT_EQ(settled(used, [] { return device_used(); }), used);
  }

  fs::path receiver_proc;
  std::size_t fds, maps, receiver_fds, receiver_maps;
  std::multiset<std::string> maps_kinds, receiver_maps_kinds;
  std::uint64_t used;
};

void expect_committed(const session::PushReport& report, std::uint64_t version,
                      std::optional<bool> direct = std::nullopt) {
  ASSERT_EQ(report.receivers.size(), 1u);
  const auto& r = report.receivers[0];
  EXPECT_TRUE(r.committed) << r.error;
  EXPECT_EQ(r.transport, "cuda_ipc");
  if (direct) {
    EXPECT_EQ(r.direct, *direct) << "direct delivery";
    // cuda_ipc fingerprints in its copy kernel whenever it writes in place.
    EXPECT_EQ(r.writer_fingerprints, *direct) << "fingerprints from the writing copy";
  }
  EXPECT_EQ(report.version, version);
}

config::Config with_delivery(config::Delivery delivery) {
  config::Config c;
  c.update.delivery = delivery;
  return c;
}

// Rank `rank` of `world` of a sharded trainer holding `tensors` whole: each view is the block of
// rows [n*rank/world, n*(rank+1)/world) of its (one-dimensional) tensor.
std::vector<session::TensorView> row_blocks(const std::vector<session::TensorView>& whole,
                                            std::uint32_t rank, std::uint32_t world) {
  std::vector<session::TensorView> out;
  for (const auto& t : whole) {
    const std::uint64_t n = t.shape[0];
    const std::uint64_t lo = n * rank / world;
    const std::uint64_t hi = n * (rank + 1) / world;
    session::TensorView v = t;
    v.shape = {hi - lo};
    v.data = static_cast<const std::byte*>(t.data) + lo * 4;  // F32
    v.global_shape = {n};
    v.offsets = {lo};
    out.push_back(std::move(v));
  }
  return out;
}

// The sender of SenderKilledWhileWritingInPlace... and ShardedRankKilledWhileWriting...: this
// test binary run again as a child (FERRY_TEST_DIRECT_PUSH_TO or FERRY_TEST_SHARDED_PUSH_TO =
// <receiver>), pushing 32 tensors by direct delivery in buckets of `bucket_bytes` and SIGKILLing
// itself right after bucket `kill_after` was written into the receiver's parameters; with
// `shard`, as that rank of a sharded trainer (its row blocks).
int killed_push_child(const std::string& receiver, std::uint64_t bucket_bytes,
                      std::uint32_t kill_after, std::optional<session::ShardSpec> shard) {
  DeviceTensors tensors(32, 32768);
  tensors.fill(2);
  const auto config = with_delivery(config::Delivery::direct);
  registry::Registry registry({plugin_dir()});
  session::SenderOptions o = sender_options({receiver}, bucket_bytes);
  o.after_bucket = [kill_after](const std::string&, std::uint32_t bucket) {
    if (bucket == kill_after) ::raise(SIGKILL);
  };
  session::Sender sender(config, registry, o);
  const auto views =
      shard ? row_blocks(tensors.views(), shard->rank, shard->world) : tensors.views();
  const auto report = sender.push(views, 2, std::nullopt, {}, shard);
  std::fprintf(stderr, "the push ended without being killed: %s\n",
               report.receivers.empty() ? "" : report.receivers[0].error.c_str());
  return 3;
}

// A GPU receiver of the dense checkpoint at `model_path` as tensor-parallel rank `rank` of 2: its
// plan reads column slices and parts of fused tensors, so no tensor is one whole copy.
ServeOptions gpu_tp_receiver(const std::string& model_path, unsigned rank,
                             std::uint64_t bucket_timeout_ms = 5000) {
  ServeOptions o = receiver_options(model_path, rank, 2, bucket_timeout_ms);
  o.model_family = "dense";
  o.sets.push_back("receiver.device=cuda:0");
  return o;
}

// The sender of SenderKilledWhileItsTensorsAreReadInPlace...: this test binary run again as a
// child (FERRY_TEST_READ_PUSH_TO = <receiver>), pushing version 2 of the session tests' dense
// checkpoint (TwoVersions' seed) into a tensor-parallel rank, which reads it in place, in
// buckets of 1 KiB, and SIGKILLing itself right after announcing bucket 3.
int killed_read_push_child(const std::string& receiver) {
  auto f32 = [](const std::string&) { return FERRY_DTYPE_F32; };
  DeviceCheckpoint v2(make_dense_checkpoint(DenseShape{}, f32, 22));
  registry::Registry registry({plugin_dir()});
  session::SenderOptions o = sender_options({receiver}, 1024);
  o.after_bucket = [](const std::string&, std::uint32_t bucket) {
    if (bucket == 3) ::raise(SIGKILL);
  };
  session::Sender sender(config::Config{}, registry, o);
  const auto report = sender.push(v2.views(), 2);
  std::fprintf(stderr, "the push ended without being killed: %s\n",
               report.receivers.empty() ? "" : report.receivers[0].error.c_str());
  return 3;
}

class SessionCudaIpc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { versions_ = std::make_unique<TwoVersions>(); }
  static void TearDownTestSuite() { versions_.reset(); }
  // Version `version` of `tensors`, whole, written in place (direct delivery is required).
  void push_whole_direct(const ServeProcess& serve, const DeviceTensors& tensors,
                         std::uint64_t version) {
    session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                           sender_options({address_of(serve)}, 512ull << 10));
    expect_committed(sender.push(tensors.views(), version), version, true);
  }

  // A sharded trainer of `world` ranks, each pushing its rows of every tensor (row_blocks) from
  // its own thread with direct delivery required (a receiver offering none fails the push), in
  // buckets of `bucket_bytes`; every rank committed `version`, directly.
  void push_row_blocks_direct(const ServeProcess& serve, const DeviceTensors& tensors,
                              std::uint64_t version, std::uint32_t world,
                              std::uint64_t bucket_bytes) {
    const auto whole = tensors.views();
    std::vector<session::PushReport> reports(world);
    std::vector<std::thread> ranks;
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                               sender_options({address_of(serve)}, bucket_bytes));
        reports[r] = sender.push(row_blocks(whole, r, world), version, std::nullopt, {},
                                 session::ShardSpec{r, world});
      });
    }
    for (auto& t : ranks) t.join();
    for (const auto& report : reports) expect_committed(report, version, true);
  }

  // Releases the receiver's memory, expecting at least 9/10 of `payload` bytes of device memory
  // back (no sender still holds the released weights mapped), then resumes it.
  static void release_and_resume(ServeProcess& serve, std::uint64_t payload) {
    const std::uint64_t used = device_used();
    const Reply release =
        serve.post("/release_memory_occupation", nlohmann::json::object(), serve.auth());
    ASSERT_EQ(release.status, 200) << release.text;
    const std::uint64_t after = device_used();
    EXPECT_GE(used - std::min(used, after), payload * 9 / 10)
        << "device memory in use went from " << used << " to " << after
        << " bytes: someone still holds the released weights\n"
        << serve.log();
    const Reply resume =
        serve.post("/resume_memory_occupation", nlohmann::json::object(), serve.auth());
    ASSERT_EQ(resume.status, 200) << resume.text;
  }

  // This test binary run again as a child that pushes to `serve` instead of running the tests
  // (before_gpu_tests below): `variable` names which push (FERRY_TEST_*_PUSH_TO).
  static std::unique_ptr<PushProcess> push_child(const std::string& variable,
                                                 const ServeProcess& serve) {
    const std::string exe = std::getenv("FERRY_EXE") != nullptr ? std::getenv("FERRY_EXE") : "";
    ::setenv("FERRY_EXE", "/proc/self/exe", 1);
    auto child = std::make_unique<PushProcess>(
        std::vector<std::string>{"--gtest_filter=-*"},
        std::map<std::string, std::string>{{variable, address_of(serve)}});
    ::setenv("FERRY_EXE", exe.c_str(), 1);
    return child;
  }

  static std::unique_ptr<TwoVersions> versions_;
  config::Config config_;
  registry::Registry registry_{{plugin_dir()}};
};
std::unique_ptr<TwoVersions> SessionCudaIpc::versions_;

class SessionCudaIpcDelivery : public SessionCudaIpc,
                               public ::testing::WithParamInterface<config::Delivery> {};

// The dense checkpoint (fused qkv and gate_up: tensors land in slices of engine parameters).
TEST_P(SessionCudaIpcDelivery, DenseCheckpointFromDeviceMemoryIsBitIdentical) {
  const bool direct = GetParam() == config::Delivery::direct;
  ServeProcess serve(gpu_receiver(versions_->v1_path()));
  ASSERT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
  DeviceCheckpoint v2(versions_->v2);
  session::Sender sender(with_delivery(GetParam()), registry_,
                         sender_options({address_of(serve)}, 1024));
  expect_committed(sender.push(v2.views(), 2), 2, direct);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 0, 1));
  EXPECT_EQ(version_of(serve), 2);
}

INSTANTIATE_TEST_SUITE_P(Modes, SessionCudaIpcDelivery,
                         ::testing::Values(config::Delivery::direct, config::Delivery::staged),
                         [](const auto& info) {
                           return info.param == config::Delivery::direct ? "direct" : "staged";
                         });

class SessionCudaIpcTensorCount
    : public SessionCudaIpc,
      public ::testing::WithParamInterface<std::tuple<std::size_t, config::Delivery>> {};

TEST_P(SessionCudaIpcTensorCount, TwoUpdatesAreBitIdentical) {
  const auto [count, delivery] = GetParam();
  const bool direct = delivery == config::Delivery::direct;
  // About 16 MiB in all, in 2 MiB buckets: both slots are reused several times.
  const std::uint64_t elements = std::max<std::uint64_t>(1, (4ull << 20) / count);
  DeviceTensors tensors(count, elements);
  ServeProcess serve(gpu_receiver());
  session::Sender sender(with_delivery(delivery), registry_,
                         sender_options({address_of(serve)}, 2ull << 20));
  for (std::uint64_t version = 1; version <= 2; ++version) {
    SCOPED_TRACE(fmt::format("{} tensors, {}, version {}", count, direct ? "direct" : "staged",
                             version));
    tensors.fill(version * 1000 + count);
    const auto views = tensors.views();
    expect_committed(sender.push(views, version), version, direct);
    EXPECT_EQ(serve.fingerprints(), tensors.expected());
    EXPECT_EQ(version_of(serve), static_cast<long long>(version));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Counts, SessionCudaIpcTensorCount,
    ::testing::Combine(::testing::Values(1, 256, 4096),
                       ::testing::Values(config::Delivery::direct, config::Delivery::staged)),
    [](const auto& info) {
      return fmt::format("{}_{}", std::get<0>(info.param),
                         std::get<1>(info.param) == config::Delivery::direct ? "direct" : "staged");
    });

// A trainer pushes right after its optimizer step, whose kernels are still queued: a kernel on
// the producer's stream waits 300 ms (1 s before the first push) on the GPU, then writes the
// tensors' new values. Named as the
// producer's stream, an event after it, or (the default) by synchronising the device, the push
// reads the final bytes, in both delivery modes, first and kept session alike.
class SessionCudaIpcStreamOrder
    : public SessionCudaIpc,
      public ::testing::WithParamInterface<std::tuple<config::Delivery, order::Wait>> {};

TEST_P(SessionCudaIpcStreamOrder, APushRightAfterTheProducersKernelSendsItsFinalBytes) {
  const auto [delivery, wait] = GetParam();
  DeviceTensors tensors(64, 65536);
  DeviceTensors next(64, 65536);
  tensors.fill(1);
  ServeProcess serve(gpu_receiver());
  session::Sender sender(with_delivery(delivery), registry_,
                         sender_options({address_of(serve)}, 4ull << 20));
  cudaStream_t producer = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  for (std::uint64_t version = 1; version <= 3; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    next.fill(100 + version);
    // The first push's handshake (~0.2-0.3 s: a new session, the receiver's memory imported)
    // runs beside the producer's kernel now that the push waits only before its first read: a
    // longer kernel leaves it a wait to measure.
    ASSERT_CUDA(tensors.queue_update_from(next, version == 1 ? 1000 : 300, producer));
    order::StreamOrder producers;
    producers.wait = wait;
    cudaEvent_t event = nullptr;
    if (wait == order::Wait::streams) {
      producers.handles = {reinterpret_cast<std::uintptr_t>(producer)};
    } else if (wait == order::Wait::events) {
      ASSERT_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      ASSERT_CUDA(cudaEventRecord(event, producer));
      producers.handles = {reinterpret_cast<std::uintptr_t>(event)};
    }
    const auto report = sender.push(tensors.views(), version, std::nullopt, producers);
    if (event != nullptr) {
      ASSERT_CUDA(cudaEventDestroy(event));
    }
    expect_committed(report, version, delivery == config::Delivery::direct);
    EXPECT_GT(report.producer_wait_seconds, 0.1) << "the push did not wait for the producer";
    EXPECT_EQ(serve.fingerprints(), tensors.expected()) << "bytes read before the producer wrote";
  }
  ASSERT_CUDA(cudaStreamDestroy(producer));
}

INSTANTIATE_TEST_SUITE_P(
    Orders, SessionCudaIpcStreamOrder,
    ::testing::Combine(::testing::Values(config::Delivery::direct, config::Delivery::staged),
                       ::testing::Values(order::Wait::streams, order::Wait::events,
                                         order::Wait::sync_devices)),
    [](const auto& info) {
      return fmt::format("{}_{}",
                         std::get<0>(info.param) == config::Delivery::direct ? "direct" : "staged",
                         order::wait_name(std::get<1>(info.param)));
    });

// The control: told the tensors are final (Wait::none) while the producer's kernel is queued, a
// push through the kept session (the first push's set-up happens to synchronise the device, as
// in the user report where step 1 matched and step 2 did not) sends the bytes from before it:
// the hazard the ordering removes is real.
TEST_F(SessionCudaIpc, WithoutOrderingAPushWouldSendTheBytesFromBeforeTheProducersKernel) {
  DeviceTensors tensors(64, 65536);
  DeviceTensors next(64, 65536);
  tensors.fill(1);
  next.fill(2);
  ServeProcess serve(gpu_receiver());
  session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                         sender_options({address_of(serve)}, 4ull << 20));
  expect_committed(sender.push(tensors.views(), 1), 1, true);
  const auto before = tensors.expected();
  ASSERT_EQ(serve.fingerprints(), before);
  cudaStream_t producer = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  ASSERT_CUDA(tensors.queue_update_from(next, 1000, producer));
  order::StreamOrder none;
  none.wait = order::Wait::none;
  const auto report = sender.push(tensors.views(), 2, std::nullopt, none);
  expect_committed(report, 2, true);
  EXPECT_TRUE(report.receivers[0].reused_session);
  EXPECT_EQ(serve.fingerprints(), before);
  ASSERT_CUDA(cudaStreamSynchronize(producer));
  ASSERT_CUDA(cudaStreamDestroy(producer));
}

// A receiver that reads back what was written in place (update.direct_verify = "reread")
// checks the fingerprints the sender's copy kernel computed as it wrote: a wrong one would fail
// the commit. Tensor sizes of 4 mod 8 bytes exercise the kernel's tail.
TEST_F(SessionCudaIpc, RereadAtCommitAgreesWithTheWritingCopysFingerprints) {
  DeviceTensors tensors(256, (1ull << 20) / 4 + 1);
  ServeOptions options = gpu_receiver();
  options.sets.push_back("update.direct_verify=reread");
  ServeProcess serve(options);
  session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                         sender_options({address_of(serve)}, 16ull << 20));
  for (std::uint64_t version = 1; version <= 2; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    tensors.fill(version * 77);
    expect_committed(sender.push(tensors.views(), version), version, true);
    EXPECT_EQ(serve.fingerprints(), tensors.expected());
    EXPECT_EQ(version_of(serve), static_cast<long long>(version));
  }
}

// Automatic delivery picks direct for an identity layout on the GPU.
TEST_F(SessionCudaIpc, AutoDeliveryWritesInPlaceWhenEveryPlanIsACopy) {
  DeviceTensors tensors(8, 4096);
  tensors.fill(5);
  ServeProcess serve(gpu_receiver());
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 1ull << 20));
  expect_committed(sender.push(tensors.views(), 1), 1, true);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
}

// Direct delivery refused: a receiver that keeps its weights on the cpu offers none, and a
// sender that requires it fails naming why, without touching the receiver.
TEST_F(SessionCudaIpc, RequiredDirectDeliveryWithoutAnOfferFailsClearly) {
  DeviceTensors tensors(4, 4096);
  tensors.fill(6);
  ServeProcess serve(gpu_receiver());
  {
    session::Sender first(config_, registry_, sender_options({address_of(serve)}, 1ull << 20));
    expect_committed(first.push(tensors.views(), 1), 1);
  }
  // Host tensors cannot be put into device parameters by a device transport's direct path.
  std::vector<std::vector<float>> host(4);
  auto views = tensors.views();
  for (std::size_t i = 0; i < views.size(); ++i) {
    host[i].assign(views[i].shape[0], 1.5f);
    views[i].data = host[i].data();
    views[i].memory_kind = FERRY_MEMORY_HOST;
  }
  session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                         sender_options({address_of(serve)}, 1ull << 20));
  const auto report = sender.push(views, 2);
  ASSERT_EQ(report.receivers.size(), 1u);
  EXPECT_FALSE(report.receivers[0].committed);
  EXPECT_EQ(report.receivers[0].code, FERRY_STATUS_INCOMPATIBLE);
  EXPECT_NE(report.receivers[0].error.find("direct"), std::string::npos)
      << report.receivers[0].error;
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
}

// A sender killed after writing some tensors straight into live parameters: the receiver was
// dirty from the Begin on, so it rolls back from its host mirror within its deadline.
TEST_F(SessionCudaIpc, SenderKilledWhileWritingInPlaceLeavesTheReceiverAtItsVersion) {
  DeviceTensors tensors(32, 32768);  // the child's tensors have these names and sizes
  tensors.fill(1);
  ServeProcess serve(gpu_receiver("", 3000));
  push_whole_direct(serve, tensors, 1);
  auto child = push_child("FERRY_TEST_DIRECT_PUSH_TO", serve);
  ChildResult result;
  ASSERT_TRUE(child->wait(60, result));
  EXPECT_FALSE(result.exited) << result.output;
  EXPECT_EQ(result.status, SIGKILL) << result.output;
  EXPECT_TRUE(eventually([&] {
    return serve.get("/metrics").text.find("ferry_updates_aborted_total 1") != std::string::npos;
  }, 10)) << serve.log();
  EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20)) << serve.log();
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
}

// Reads in place ([one-pass]): a tensor-parallel rank's plan is no whole copy, so with the
// default delivery the receiver maps the sender's tensors and applies its plan straight from
// them (no staging copy). Over one kept session: two versions from different allocations (the
// first push's are let go), then a release and resume of the receiver's memory (the session,
// which shares none of it, is left as it is: no suspension, no rejoin, nothing mapped again) and
// a third; each bit-identical to the CPU twin of the same rank, and to what staged delivery of
// the same plan gives. A push while the weights are released fails naming them.
TEST_F(SessionCudaIpc, ATensorParallelRankReadsTheTensorsInPlaceBitIdentical) {
  for (unsigned rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(fmt::format("tp rank {} of 2", rank));
    auto options = gpu_tp_receiver(versions_->v1_path(), rank);
    options.log_level = "info";  // its sessions' lines
    ServeProcess serve(options);
    ASSERT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, rank, 2));
    DeviceCheckpoint v1(versions_->v1);
    DeviceCheckpoint v2(versions_->v2);
    // Whole tensors every push (not as rank 0 of 1 from the second on): reads in place.
    session::SenderOptions whole = sender_options({address_of(serve)}, 1024);
    whole.parts_as_rank = false;
    session::Sender sender(config_, registry_, whole);
    auto push = [&](const DeviceCheckpoint& c, std::uint64_t version, bool reused) {
      const auto report = sender.push(c.views(), version);
      expect_committed(report, version, false);
      ASSERT_EQ(report.receivers.size(), 1u);
      EXPECT_TRUE(report.receivers[0].reads_in_place) << serve.log();
      EXPECT_EQ(report.receivers[0].reused_session, reused);
    };
    push(v2, 2, false);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, rank, 2));
    push(v1, 3, true);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, rank, 2));
    ASSERT_EQ(
        serve.post("/release_memory_occupation", nlohmann::json::object(), serve.auth()).status,
        200);
    ASSERT_EQ(
        serve.post("/resume_memory_occupation", nlohmann::json::object(), serve.auth()).status,
        200);
    push(v2, 4, true);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, rank, 2));
    EXPECT_EQ(version_of(serve), 4);
    EXPECT_NE(serve.log().find("left as they are"), std::string::npos) << serve.log();
    EXPECT_EQ(serve.log().find("suspended for the release"), std::string::npos) << serve.log();
    EXPECT_EQ(serve.log().find("rejoined"), std::string::npos) << serve.log();
    ASSERT_EQ(
        serve.post("/release_memory_occupation", nlohmann::json::object(), serve.auth()).status,
        200);
    const auto refused = sender.push(v1.views(), 5);
    ASSERT_EQ(refused.receivers.size(), 1u);
    EXPECT_FALSE(refused.receivers[0].committed);
    EXPECT_NE(refused.receivers[0].error.find("released"), std::string::npos)
        << refused.receivers[0].error;
    ASSERT_EQ(
        serve.post("/resume_memory_occupation", nlohmann::json::object(), serve.auth()).status,
        200);
    EXPECT_EQ(version_of(serve), 4);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, rank, 2));
    // The same plan staged (update.delivery = "staged") lands the same bytes.
    session::Sender staged(with_delivery(config::Delivery::staged), registry_,
                           sender_options({address_of(serve)}, 1024));
    const auto report = staged.push(v1.views(), 6);
    expect_committed(report, 6, false);
    EXPECT_FALSE(report.receivers[0].reads_in_place);
    EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, rank, 2));
  }
}

// Reads in place with FP8 block quantisation on arrival (the lowbit family: every linear weight
// F8_E4M3 with 128x128 block scales, quantised by the GPU kernel straight from the sender's
// tensors): the receiver's parameters and scales are bit-identical to a CPU receiver's (its CPU
// kernels) given the same checkpoint inline. The "hf" layout keeps q/k/v and gate/up apart (the
// tiny model's fused parts would not fall on 128x128 blocks).
TEST_F(SessionCudaIpc, FP8QuantisationOnArrivalReadsInPlaceBitIdenticalToTheCpuTwin) {
  ServeOptions gpu = receiver_options(versions_->v1_path(), 0, 1, 5000);
  gpu.model_family = "lowbit";
  gpu.layout = "hf";
  gpu.sets.push_back("receiver.device=cuda:0");
  ServeOptions cpu = gpu;
  cpu.sets.pop_back();
  ServeProcess on_gpu(gpu);
  ServeProcess on_cpu(cpu);
  ASSERT_EQ(on_gpu.fingerprints(), on_cpu.fingerprints());
  DeviceCheckpoint v2(versions_->v2);
  session::Sender sender(config_, registry_, sender_options({address_of(on_gpu)}, 1024));
  const auto report = sender.push(v2.views(), 2);
  expect_committed(report, 2, false);
  EXPECT_TRUE(report.receivers[0].reads_in_place) << on_gpu.log();
  session::SenderOptions inline_options = sender_options({address_of(on_cpu)}, 1024);
  inline_options.transport = "inline";
  session::Sender twin(config_, registry_, inline_options);
  const auto twin_report = twin.push(views_of(versions_->v2), 2);
  ASSERT_TRUE(twin_report.receivers[0].committed) << twin_report.receivers[0].error;
  const auto fp8 = on_gpu.fingerprints();
  EXPECT_EQ(fp8, on_cpu.fingerprints());
  EXPECT_TRUE(fp8.count("model.layers.0.mlp.down_proj.weight_scale_inv")) << fp8.size();
}

// A sender killed after announcing some buckets whose tensors the receiver reads in place: the
// receiver had written part of its parameters, so it rolls back from its host mirror; nothing of
// version 2 is published, and it serves the next push.
TEST_F(SessionCudaIpc, SenderKilledWhileItsTensorsAreReadInPlaceLeavesTheReceiverAtItsVersion) {
  ServeProcess serve(gpu_tp_receiver(versions_->v1_path(), 1, 3000));
  const auto v1 = expected_fingerprints(versions_->v1, 1, 2);
  ASSERT_EQ(serve.fingerprints(), v1);
  const long long loaded = version_of(serve);
  auto child = push_child("FERRY_TEST_READ_PUSH_TO", serve);
  ChildResult result;
  ASSERT_TRUE(child->wait(60, result));
  EXPECT_FALSE(result.exited) << result.output;
  EXPECT_EQ(result.status, SIGKILL) << result.output;
  EXPECT_TRUE(eventually(
      [&] {
        return serve.get("/metrics").text.find("ferry_updates_aborted_total 1") !=
               std::string::npos;
      },
      10))
      << serve.log();
  EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20)) << serve.log();
  EXPECT_EQ(version_of(serve), loaded);
  EXPECT_EQ(serve.fingerprints(), v1);
  DeviceCheckpoint v2(versions_->v2);
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 1024));
  const auto report = sender.push(v2.views(), 2);
  expect_committed(report, 2, false);
  EXPECT_TRUE(report.receivers[0].reads_in_place);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v2, 1, 2));
}

// A sharded trainer of 2 ranks, each holding half the rows of every tensor in its own thread:
// every block goes straight into the receiver's parameters (direct delivery is required, so a
// receiver that offered none would fail the push), and the result equals the tensors whole.
TEST_F(SessionCudaIpc, ShardedRanksWriteTheirRowBlocksInPlaceBitIdentical) {
  DeviceTensors tensors(32, 32768);
  ServeProcess serve(gpu_receiver());
  tensors.fill(1);
  push_whole_direct(serve, tensors, 1);
  for (std::uint64_t version = 2; version <= 3; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    tensors.fill(version);
    push_row_blocks_direct(serve, tensors, version, 2, 128ull << 10);
    EXPECT_EQ(version_of(serve), static_cast<int>(version));
    EXPECT_EQ(serve.fingerprints(), tensors.expected());
  }
}

// Three ranks' row blocks of 6 MB tensors start inside 1 MiB chunks of their parameters: each
// such piece goes as two copies, the second's chunk hashes making the parameter's fingerprint
// with the other ranks' (Destination.chunkHead); the published fingerprints are those of the
// values, and every rank went direct.
TEST_F(SessionCudaIpc, ShardedPiecesStartingInsideAChunkAreFingerprintedFromTheirChunkHashes) {
  DeviceTensors tensors(6, 1500001);
  ServeProcess serve(gpu_receiver());
  tensors.fill(1);
  push_whole_direct(serve, tensors, 1);
  for (std::uint64_t version = 2; version <= 3; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    tensors.fill(version);
    push_row_blocks_direct(serve, tensors, version, 3, 8ull << 20);
    EXPECT_EQ(version_of(serve), static_cast<int>(version));
    EXPECT_EQ(serve.fingerprints(), tensors.expected());
    // Only the chunks where two ranks' pieces meet were read again (2 per tensor), not the
    // pieces of ranks 1 and 2 whole (2/3 of every tensor).
    const auto metrics = serve.get("/metrics").text;
    const auto at = metrics.find("\nferry_commit_fingerprint_read_bytes ");
    ASSERT_NE(at, std::string::npos) << metrics;
    const double read = std::stod(metrics.substr(at + 37));
    EXPECT_GT(read, 0);
    EXPECT_LE(read, 6.0 * 2 * (1 << 20)) << "the commit read " << read << " bytes again";
  }
}

// A rank killed after writing some of its blocks straight into live parameters: the whole
// sharded update aborts, the other rank's report names the dead one, and the receiver (dirty
// from the Begin on) rolls back from its host mirror to its version.
TEST_F(SessionCudaIpc, ShardedRankKilledWhileWritingInPlaceLeavesTheReceiverAtItsVersion) {
  DeviceTensors tensors(32, 32768);  // the child's tensors have these names and sizes
  tensors.fill(1);
  ServeProcess serve(gpu_receiver("", 3000));
  push_whole_direct(serve, tensors, 1);
  const auto before = tensors.expected();
  auto child = push_child("FERRY_TEST_SHARDED_PUSH_TO", serve);
  tensors.fill(2);
  session::Sender sender(with_delivery(config::Delivery::direct), registry_,
                         sender_options({address_of(serve)}, 128ull << 10));
  const auto report = sender.push(row_blocks(tensors.views(), 0, 2), 2, std::nullopt, {},
                                  session::ShardSpec{0, 2});
  ChildResult result;
  ASSERT_TRUE(child->wait(60, result));
  EXPECT_FALSE(result.exited) << result.output;
  EXPECT_EQ(result.status, SIGKILL) << result.output;
  ASSERT_EQ(report.receivers.size(), 1u);
  EXPECT_FALSE(report.receivers[0].committed);
  EXPECT_NE(report.receivers[0].error.find("rank 1"), std::string::npos)
      << report.receivers[0].error;
  EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20)) << serve.log();
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), before);
}

TEST_F(SessionCudaIpc, HundredUpdatesGrowNeitherFdsNorMappingsNorDeviceMemory) {
  DeviceTensors tensors(64, 16384);  // 4 MiB in 1 MiB buckets
  tensors.fill(1);
  // One malloc arena in the receiver: glibc adds arenas (each a new mapping) as more threads
  // contend, up to 8 per core, which is allocator behaviour and not a leak; with one arena a
  // mapping that appears is ours. (The child reads it at exec; this process is not affected.)
  ::setenv("MALLOC_ARENA_MAX", "1", 1);
  ServeProcess serve(gpu_receiver());
  ::unsetenv("MALLOC_ARENA_MAX");
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 1ull << 20));
  const auto views = tensors.views();
  // Warm-up: contexts, pools, the receiver's layout and plan cache exist afterwards, and so does
  // what the receiver's first fingerprint kernel sets up (its stream-ordered memory pool, whose
  // address reservation is a new mapping): with the writing copy's fingerprints trusted, no
  // commit runs one, and the check below does.
  for (std::uint64_t v = 1; v <= 3; ++v) expect_committed(sender.push(views, v), v);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  const Footprint before(serve.pid());
  for (std::uint64_t v = 4; v < 104; ++v) {
    const auto report = sender.push(views, v);
    ASSERT_TRUE(report.all_committed()) << report.receivers[0].error;
  }
  EXPECT_EQ(version_of(serve), 103);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  before.expect_unchanged();
}

// A kept session shares the receiver's weights with the sender (the sender maps them): a
// release first suspends it, and the sender unmaps before the receiver lets the release go on,
// so the device memory is free when the release returns. The next push rejoins the session
// (no new handshake) and writes the resumed memory.
TEST_F(SessionCudaIpc, ReleaseSuspendsTheKeptSessionFreesTheWeightsDeviceMemoryAndThePushRejoins) {
  DeviceTensors tensors(4, (64ull << 20) / 4);  // 256 MiB
  tensors.fill(1);
  auto options = gpu_receiver();
  options.log_level = "info";  // its sessions' lines
  ServeProcess serve(options);
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 256ull << 20));
  const auto views = tensors.views();
  expect_committed(sender.push(views, 1), 1, true);
  tensors.fill(2);
  const auto second = sender.push(views, 2);
  expect_committed(second, 2, true);
  EXPECT_TRUE(second.receivers[0].reused_session);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());

  release_and_resume(serve, tensors.payload());
  tensors.fill(3);
  const auto third = sender.push(views, 3);
  expect_committed(third, 3, true);
  EXPECT_TRUE(third.receivers[0].reused_session);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  const std::string log = serve.log();
  EXPECT_NE(log.find("rejoined after the release: data path cuda_ipc, direct delivery"),
            std::string::npos)
      << log;
}

// Two ranks of a sharded trainer, each with its own Sender kept across pushes: a release
// suspends both kept sessions and frees the weights' device memory (no rank keeps it mapped);
// after the resume each rank's push rejoins its session, writes its rows straight into the
// parameters again and the result equals the tensors whole, twice over.
TEST_F(SessionCudaIpc, ReleaseSuspendsKeptShardedSessionsAndTheRanksRejoinDirect) {
  DeviceTensors tensors(8, (32ull << 20) / 4);  // 256 MiB
  auto options = gpu_receiver();
  options.log_level = "info";
  ServeProcess serve(options);
  tensors.fill(1);
  push_whole_direct(serve, tensors, 1);
  constexpr std::uint32_t kWorld = 2;
  std::vector<std::unique_ptr<session::Sender>> senders;
  for (std::uint32_t r = 0; r < kWorld; ++r) {
    senders.push_back(std::make_unique<session::Sender>(
        with_delivery(config::Delivery::direct), registry_,
        sender_options({address_of(serve)}, 64ull << 20)));
  }
  const auto push_ranks = [&](std::uint64_t version) {
    const auto whole = tensors.views();
    std::vector<session::PushReport> reports(kWorld);
    std::vector<std::thread> ranks;
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        reports[r] = senders[r]->push(row_blocks(whole, r, kWorld), version, std::nullopt, {},
                                      session::ShardSpec{r, kWorld});
      });
    }
    for (auto& t : ranks) t.join();
    return reports;
  };
  tensors.fill(2);
  for (const auto& report : push_ranks(2)) expect_committed(report, 2, true);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  for (std::uint64_t version = 3; version <= 4; ++version) {
    SCOPED_TRACE(fmt::format("version {}", version));
    release_and_resume(serve, tensors.payload());
    tensors.fill(version);
    for (const auto& report : push_ranks(version)) {
      expect_committed(report, version, true);
      EXPECT_TRUE(report.receivers[0].reused_session);
    }
    EXPECT_EQ(version_of(serve), static_cast<int>(version));
    EXPECT_EQ(serve.fingerprints(), tensors.expected());
  }
  const std::string log = serve.log();
  EXPECT_EQ(count_of(log, "2 kept session(s) suspended and 0 closed"), 2u) << log;
  EXPECT_EQ(count_of(log, "rejoined after the release: data path cuda_ipc, direct delivery"), 4u)
      << log;
}

// Version 2 of `tensors` pushed on a thread while a producer stream runs a `wait_ms` kernel and
// then writes `next` into them (a slow "optimizer step"): whether `serve` logged `line` and, at
// that moment, whether the producer was still busy.
struct PushedWhileProducing {
  session::PushReport report;
  bool logged = false;
  bool producer_busy = false;
};

PushedWhileProducing push_while_producing(session::Sender& sender, DeviceTensors& tensors,
                                          const DeviceTensors& next, unsigned wait_ms,
                                          ServeProcess& serve, const std::string& line) {
  PushedWhileProducing out;
  cudaStream_t producer = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(tensors.queue_update_from(next, wait_ms, producer), cudaSuccess);
  order::StreamOrder producers;
  producers.wait = order::Wait::streams;
  producers.handles = {reinterpret_cast<std::uintptr_t>(producer)};
  std::thread pushing(
      [&] { out.report = sender.push(tensors.views(), 2, std::nullopt, producers); });
  out.logged = eventually(
      [&] {
        if (serve.log().find(line) == std::string::npos) return false;
        out.producer_busy = cudaStreamQuery(producer) == cudaErrorNotReady;
        return true;
      },
      60);
  pushing.join();
  EXPECT_EQ(cudaStreamDestroy(producer), cudaSuccess);
  return out;
}

// The push after a resume rejoins the kept session and maps the resumed memory while the
// trainer's kernels still run: the producer stream is busy for seconds (a slow "optimizer
// step", within the receiver's 5 s bucket deadline, which runs from the Ready: the Begin does
// not wait for the kernels either), and the receiver logs the rejoin while it still is, which it
// could not if the push waited for the stream first. The bytes that step writes are the ones
// published. (A sender told of the resume rejoins before its push: this one is not, so its push
// rejoins.)
TEST_F(SessionCudaIpc, ThePushAfterAResumeRejoinsWhileItsProducersStillRun) {
  DeviceTensors tensors(16, (16ull << 20) / 4);  // 256 MiB
  DeviceTensors next(16, (16ull << 20) / 4);
  tensors.fill(1);
  next.fill(7);
  auto options = gpu_receiver();
  options.log_level = "info";  // its sessions' lines
  ServeProcess serve(options);
  auto rejoins_at_push = sender_options({address_of(serve)}, 64ull << 20);
  rejoins_at_push.rejoin_when_resumed = false;
  session::Sender sender(config_, registry_, rejoins_at_push);
  expect_committed(sender.push(tensors.views(), 1), 1, true);
  ASSERT_EQ(serve.post("/release_memory_occupation", nlohmann::json::object(), serve.auth()).status,
            200);
  ASSERT_EQ(serve.post("/resume_memory_occupation", nlohmann::json::object(), serve.auth()).status,
            200);
  const auto pushed =
      push_while_producing(sender, tensors, next, 2500, serve, "rejoined after the release");
  EXPECT_TRUE(pushed.logged) << serve.log();
  EXPECT_TRUE(pushed.producer_busy) << "the push rejoined only after its producers were done";
  expect_committed(pushed.report, 2, true);
  EXPECT_TRUE(pushed.report.receivers[0].reused_session);
  EXPECT_GT(pushed.report.producer_wait_seconds, 1.0) << "the push did not wait for the producer";
  EXPECT_EQ(serve.fingerprints(), tensors.expected()) << "bytes read before the producer wrote";
}

// A kept session's update begins while the trainer's kernels still run: the push marks the
// producer's work and waits for it only before its copies launch, so the receiver logs the
// Begin (and answers Ready) while the producer stream is still busy (a 2 s "optimizer step",
// within the receiver's 5 s bucket deadline, which runs from its Ready). The bytes that step
// writes are the ones published, through the copies queued during the wait.
TEST_F(SessionCudaIpc, AKeptSessionBeginsItsUpdateWhileItsProducersStillRun) {
  DeviceTensors tensors(16, (16ull << 20) / 4);  // 256 MiB
  DeviceTensors next(16, (16ull << 20) / 4);
  tensors.fill(1);
  next.fill(9);
  auto options = gpu_receiver();
  options.log_level = "debug";  // its sessions' Begin lines
  ServeProcess serve(options);
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 64ull << 20));
  expect_committed(sender.push(tensors.views(), 1), 1, true);
  const auto pushed = push_while_producing(sender, tensors, next, 2000, serve,
                                           "begin of version 2: Ready");
  EXPECT_TRUE(pushed.logged) << serve.log();
  EXPECT_TRUE(pushed.producer_busy) << "the update began only after its producers were done";
  expect_committed(pushed.report, 2, true);
  EXPECT_TRUE(pushed.report.receivers[0].reused_session);
  EXPECT_GT(pushed.report.producer_wait_seconds, 1.0) << "the push did not wait for the producer";
  EXPECT_EQ(serve.fingerprints(), tensors.expected()) << "bytes read before the producer wrote";
}

// The colocated RL loop, a hundred times: release, resume, push. Every push rejoins the kept
// session and is verified, and neither side grows its fds, mappings or device memory.
TEST_F(SessionCudaIpc, HundredReleaseResumePushCyclesRejoinAndGrowNeitherFdsNorMappingsNorMemory) {
  DeviceTensors tensors(64, 16384);  // 4 MiB in 1 MiB buckets
  tensors.fill(1);
  ::setenv("MALLOC_ARENA_MAX", "1", 1);  // as in HundredUpdatesGrow...: one arena
  auto options = gpu_receiver();
  options.log_level = "info";  // its sessions' lines
  ServeProcess serve(options);
  ::unsetenv("MALLOC_ARENA_MAX");
  session::Sender sender(config_, registry_, sender_options({address_of(serve)}, 1ull << 20));
  const auto views = tensors.views();
  const auto cycle = [&](std::uint64_t v) {
    const Reply release =
        serve.post("/release_memory_occupation", nlohmann::json::object(), serve.auth());
    ASSERT_EQ(release.status, 200) << release.text;
    const Reply resume =
        serve.post("/resume_memory_occupation", nlohmann::json::object(), serve.auth());
    ASSERT_EQ(resume.status, 200) << resume.text;
    tensors.fill(v);
    const auto report = sender.push(views, v);
    ASSERT_TRUE(report.all_committed()) << report.receivers[0].error;
    ASSERT_TRUE(report.receivers[0].reused_session) << "push " << v << " opened a new session";
    ASSERT_TRUE(report.receivers[0].direct) << "push " << v;
  };
  for (std::uint64_t v = 1; v <= 3; ++v) expect_committed(sender.push(views, v), v);
  for (std::uint64_t v = 4; v <= 6; ++v) cycle(v);  // warm-up, as in HundredUpdatesGrow...
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  const Footprint before(serve.pid());
  for (std::uint64_t v = 7; v < 107; ++v) {
    cycle(v);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(version_of(serve), 106);
  EXPECT_EQ(serve.fingerprints(), tensors.expected());
  before.expect_unchanged();
  const std::string log = serve.log();
  EXPECT_EQ(count_of(log, "layout accepted"), 1u) << "more than one handshake";
  EXPECT_EQ(count_of(log, "rejoined after the release: data path cuda_ipc, direct delivery"), 103u);
}

TEST_F(SessionCudaIpc, SenderKilledMidUpdateLeavesTheReceiverAtItsVersion) {
  // `ferry push` of host tensors through cuda_ipc (host slots put into the receiver's device
  // slots), SIGKILLed by its test hook after bucket 2 of about ten.
  ServeProcess serve(gpu_receiver(versions_->v1_path(), 3000));
  PushProcess push({"--log-level", "warn", "push", "--to", address_of(serve), "--transport",
                    "cuda_ipc", "--model-path", versions_->v2_path(), "--version", "2",
                    "--bucket-bytes", "512", "--test-exit-after-bucket", "2"},
                   {});
  ChildResult result;
  ASSERT_TRUE(push.wait(60, result));
  EXPECT_FALSE(result.exited) << result.output;
  EXPECT_EQ(result.status, SIGKILL);
  // Within the receiver's 3 s bucket deadline (plus process start-up slack).
  EXPECT_TRUE(eventually([&] {
    return serve.get("/metrics").text.find("ferry_updates_aborted_total 1") != std::string::npos;
  }, 10)) << serve.log();
  EXPECT_TRUE(eventually([&] { return serve.get("/health").status == 200; }, 20)) << serve.log();
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions_->v1, 0, 1));
}

TEST_F(SessionCudaIpc, ReceiverKilledMidUpdateIsNamedAndARestartedOneImportsAfresh) {
  DeviceTensors tensors(32, 32768);  // 4 MiB in 512 KiB buckets
  tensors.fill(7);
  const auto views = tensors.views();
  auto first = std::make_unique<ServeProcess>(gpu_receiver());
  const std::string first_address = address_of(*first);
  const pid_t first_pid = first->pid();
  {
    session::Sender sender(config_, registry_, sender_options({first_address}, 512ull << 10));
    expect_committed(sender.push(views, 1), 1);
  }
  session::SenderOptions options = sender_options({first_address}, 512ull << 10);
  options.after_bucket = [&](const std::string&, std::uint32_t bucket) {
    if (bucket == 1) ::kill(first_pid, SIGKILL);
  };
  {
    session::Sender sender(config_, registry_, options);
    const auto report = sender.push(views, 2);
    ASSERT_EQ(report.receivers.size(), 1u);
    const auto& r = report.receivers[0];
    EXPECT_FALSE(r.committed);
    EXPECT_NE(r.error.find(first_address), std::string::npos) << r.error;
  }
  first.reset();
  ServeProcess second(gpu_receiver());
  tensors.fill(8);
  session::Sender sender(config_, registry_, sender_options({address_of(second)}, 512ull << 10));
  expect_committed(sender.push(views, 3), 3);
  EXPECT_EQ(second.fingerprints(), tensors.expected());
}

}  // namespace
}  // namespace ferry::test

// main() is the GPU tests' shared one (tests/common/gpu_test_main.cpp: exit 77 without a CUDA
// device); it asks this hook first, so that this binary run again as a child with
// FERRY_TEST_DIRECT_PUSH_TO set does one direct push instead of running the tests.
#include "tests/common/gpu_test_main.hpp"

std::optional<int> ferry::test::before_gpu_tests(int /*argc*/, char** /*argv*/) {
  if (const char* to = std::getenv("FERRY_TEST_DIRECT_PUSH_TO")) {
    return killed_push_child(to, 512ull << 10, 2, std::nullopt);
  }
  if (const char* to = std::getenv("FERRY_TEST_READ_PUSH_TO")) return killed_read_push_child(to);
  if (const char* to = std::getenv("FERRY_TEST_SHARDED_PUSH_TO")) {
    return killed_push_child(to, 128ull << 10, 1, session::ShardSpec{1, 2});
  }
  return std::nullopt;
}
