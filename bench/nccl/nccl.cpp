// bench/nccl/nccl.cpp: `ferry bench nccl`: the plugin's bucketed broadcast vs a plain
// ncclBroadcast of the same buffers, one process per GPU (see nccl.hpp).
#include "bench/nccl/nccl.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ferry_build_config.h"

#if FERRY_HAVE_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/context.hpp"
#include "common/host_api.hpp"
#include "common/installed_program.hpp"
#include "group/broadcast_group.hpp"
#include "group/rendezvous.hpp"
#include "registry/registry.hpp"
#endif

namespace ferry::bench {
namespace {

std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bench nccl: size '{}' is not a number (e.g. 64MiB)", text);
  }
  const std::string unit = text.substr(used);
  std::uint64_t scale = 1;
  if (unit == "KiB") scale = 1ull << 10;
  else if (unit == "MiB") scale = 1ull << 20;
  else if (unit == "GiB") scale = 1ull << 30;
  else if (!unit.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bench nccl: size '{}': unit must be KiB, MiB or GiB",
         text);
  }
  if (n == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "bench nccl: size '{}' is zero", text);
  return n * scale;
}

}  // namespace

#if FERRY_HAVE_NCCL

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kRankEnv = "FERRY_BENCH_NCCL_RANK";
constexpr const char* kWorldEnv = "FERRY_BENCH_NCCL_WORLD";

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(FERRY_STATUS_INTERNAL, "bench nccl: {}: {}", what, cudaGetErrorString(e));
}

// The plain NCCL baseline, resolved from the libnccl the plugin already loaded (so `ferry` itself
// never needs libnccl to start).
struct PlainNccl {
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetUniqueId) unique_id = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  PlainNccl() {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      fail(FERRY_STATUS_NOT_FOUND, "bench nccl: cannot load libnccl.so.2 for the baseline: {}",
           dlerror());
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (p == nullptr) fail(FERRY_STATUS_NOT_FOUND, "bench nccl: libnccl lacks {}", name);
      return p;
    };
    init_rank = reinterpret_cast<decltype(init_rank)>(sym("ncclCommInitRank"));
    init_rank_config = reinterpret_cast<decltype(init_rank_config)>(sym("ncclCommInitRankConfig"));
    async_error = reinterpret_cast<decltype(async_error)>(sym("ncclCommGetAsyncError"));
    broadcast = reinterpret_cast<decltype(broadcast)>(sym("ncclBroadcast"));
    destroy = reinterpret_cast<decltype(destroy)>(sym("ncclCommDestroy"));
    unique_id = reinterpret_cast<decltype(unique_id)>(sym("ncclGetUniqueId"));
    error_string = reinterpret_cast<decltype(error_string)>(sym("ncclGetErrorString"));
  }
  void check(ncclResult_t r, const char* what) const {
    if (r != ncclSuccess) fail(FERRY_STATUS_PEER_FAILED, "bench nccl: {}: {}", what, error_string(r));
  }
  // Polls a non-blocking communicator until its last call finished.
  void settle(ncclComm_t comm, ncclResult_t r, const char* what) const {
    while (r == ncclInProgress) async_error(comm, &r);
    check(r, what);
  }
};

// Starts ranks 1..world-1 as copies of this command with the rank in the environment.
std::vector<pid_t> start_children(std::uint32_t world) {
  std::vector<std::string> args = own_arguments();
  std::vector<pid_t> children;
  for (std::uint32_t rank = 1; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) fail(FERRY_STATUS_IO, "bench nccl: fork failed for rank {}", rank);
    if (pid == 0) {
      setenv(kRankEnv, std::to_string(rank).c_str(), 1);
      setenv(kWorldEnv, std::to_string(world).c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    children.push_back(pid);
  }
  return children;
}

double median_of(std::vector<double> v) { return median(std::move(v)); }

}  // namespace

int run_nccl_bench(const GlobalOptions& globals, const NcclBenchOptions& options, Json& records) {
  // NVLink multicast stays off unless the user chose otherwise (it can take shared GPUs down).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  const char* rank_env = std::getenv(kRankEnv);
  const bool child = rank_env != nullptr;
  const std::uint32_t rank = child ? static_cast<std::uint32_t>(std::stoul(rank_env)) : 0;

  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  std::uint32_t world = child ? static_cast<std::uint32_t>(std::stoul(std::getenv(kWorldEnv)))
                              : (options.world_size != 0 ? options.world_size
                                                         : static_cast<std::uint32_t>(gpus));
  if (!child && (gpus < 2 || world < 2 || world > static_cast<std::uint32_t>(gpus))) {
    std::fprintf(stderr,
                 "ferry bench nccl: needs at least 2 GPUs, one process per GPU (NCCL refuses two "
                 "ranks on one GPU); this machine has %d and the run asked for world size %u. "
                 "Run it on a machine with 2+ GPUs (plugins/nccl/README.md).\n",
                 gpus, world);
    return 2;
  }
  std::vector<std::uint64_t> sizes;
  for (const auto& s : options.sizes) sizes.push_back(parse_size(s));
  const std::uint64_t largest = *std::max_element(sizes.begin(), sizes.end());

  const config::Config config = load_config(globals);
  auto registry = make_registry(globals, config);
  auto plugin = registry->transport("nccl");

  std::vector<pid_t> children;
  if (!child) children = start_children(world);
  const int device = static_cast<int>(rank);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");

  void* buffer = nullptr;
  check_cuda(cudaMalloc(&buffer, largest), "cudaMalloc");
  check_cuda(cudaMemset(buffer, rank == 0 ? 0x5a : 0, largest), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  struct Row {
    std::uint64_t bytes;
    double ferry_s;     // one bucket: issue, wait (through the plugin)
    double plain_s;     // one plain ncclBroadcast + stream sync (blocking communicator)
    double plain_nb_s;  // the same on a non-blocking communicator (as the plugin's)
    int burst = 0;      // buckets per burst
    double ferry_burst_s;  // a burst, two buckets in flight (as updates run), per bucket
    double plain_burst_s;  // the burst enqueued back to back, one sync, per bucket
  };
  std::vector<Row> rows;
  int code = 0;
  try {
    // ferry: the plugin through BroadcastGroup.
    Watchdog::phase("nccl: ferry group init");
    nccl::GroupInit init;
    init.master_address = "127.0.0.1";
    init.master_port = options.master_port;
    init.world_size = world;
    init.group_name = "bench";
    init.rank = rank;
    init.device = device;
    init.init_timeout = std::chrono::seconds(120);
    nccl::BroadcastGroup group(plugin->transport(), host_api_table(), init);
    ferry_memory_t* memory = group.register_device(buffer, largest);

    // Plain NCCL: its own blocking communicator; the id travels through the same rendezvous.
    Watchdog::phase("nccl: plain communicator init");
    PlainNccl plain;
    ncclUniqueId id{};
    std::unique_ptr<nccl::RendezvousServer> server;
    nccl::GroupAddress address{"127.0.0.1", static_cast<std::uint16_t>(options.master_port + 1),
                               "bench-plain", world};
    if (rank == 0) {
      plain.check(plain.unique_id(&id), "ncclGetUniqueId");
      std::vector<std::uint8_t> blob(reinterpret_cast<std::uint8_t*>(&id),
                                     reinterpret_cast<std::uint8_t*>(&id) + sizeof id);
      server = std::make_unique<nccl::RendezvousServer>(address, blob);
      server->serve(Clock::now() + std::chrono::seconds(120));
    } else {
      nccl::RendezvousClient client;
      auto blob = client.join(address, rank, Clock::now() + std::chrono::seconds(120));
      if (blob.size() != sizeof id) fail(FERRY_STATUS_CORRUPT_DATA, "bench nccl: bad id size");
      std::memcpy(&id, blob.data(), sizeof id);
    }
    ncclComm_t comm = nullptr;
    plain.check(plain.init_rank(&comm, static_cast<int>(world), id, static_cast<int>(rank)),
                "ncclCommInitRank");
    // A non-blocking communicator like the plugin's, to tell NCCL's mode from ferry's overhead.
    ncclComm_t comm_nb = nullptr;
    {
      ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
      nb.blocking = 0;
      ncclUniqueId id_nb{};
      nccl::GroupAddress address_nb{"127.0.0.1", static_cast<std::uint16_t>(options.master_port + 2),
                                    "bench-plain-nb", world};
      std::unique_ptr<nccl::RendezvousServer> server_nb;
      if (rank == 0) {
        plain.check(plain.unique_id(&id_nb), "ncclGetUniqueId");
        std::vector<std::uint8_t> blob(reinterpret_cast<std::uint8_t*>(&id_nb),
                                       reinterpret_cast<std::uint8_t*>(&id_nb) + sizeof id_nb);
        server_nb = std::make_unique<nccl::RendezvousServer>(address_nb, blob);
        server_nb->serve(Clock::now() + std::chrono::seconds(120));
      } else {
        nccl::RendezvousClient client;
        auto blob = client.join(address_nb, rank, Clock::now() + std::chrono::seconds(120));
        if (blob.size() != sizeof id_nb) fail(FERRY_STATUS_CORRUPT_DATA, "bench nccl: bad id size");
        std::memcpy(&id_nb, blob.data(), sizeof id_nb);
      }
      const ncclResult_t r = plain.init_rank_config(&comm_nb, static_cast<int>(world), id_nb,
                                                    static_cast<int>(rank), &nb);
      plain.settle(comm_nb, r, "ncclCommInitRankConfig (non-blocking)");
    }
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

    for (const std::uint64_t bytes : sizes) {
      std::vector<double> ferry_runs, plain_runs;
      Watchdog::phase("nccl: broadcasts");
      for (int i = 0; i < options.warmup + options.repeat; ++i) {
        const auto t0 = Clock::now();
        auto pending = group.issue(memory, 0, bytes, static_cast<std::uint32_t>(i),
                                   std::chrono::seconds(60));
        group.wait(pending);
        const double ferry_s = std::chrono::duration<double>(Clock::now() - t0).count();
        const auto t1 = Clock::now();
        plain.check(plain.broadcast(buffer, buffer, bytes, ncclUint8, 0, comm, stream),
                    "ncclBroadcast");
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        const double plain_s = std::chrono::duration<double>(Clock::now() - t1).count();
        if (i >= options.warmup) {
          ferry_runs.push_back(ferry_s);
          plain_runs.push_back(plain_s);
        }
      }
      // The same on the non-blocking communicator.
      std::vector<double> nb_runs;
      for (int i = 0; i < options.warmup + options.repeat; ++i) {
        const auto t0 = Clock::now();
        plain.settle(comm_nb, plain.broadcast(buffer, buffer, bytes, ncclUint8, 0, comm_nb, stream),
                     "ncclBroadcast (non-blocking)");
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        if (i >= options.warmup) {
          nb_runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      }
      // Bursts as an update runs them: ferry keeps two buckets in flight (issue k+1, wait k);
      // plain enqueues the whole burst and synchronizes once. Per bucket.
      const int burst = static_cast<int>(
          std::clamp<std::uint64_t>((std::uint64_t{2} << 30) / bytes, 2, 16));
      std::vector<double> ferry_bursts, plain_bursts;
      for (int i = 0; i < 1 + options.repeat / 2; ++i) {
        const auto t0 = Clock::now();
        nccl::BroadcastGroup::Pending pending[2];
        pending[0] = group.issue(memory, 0, bytes, 0, std::chrono::seconds(60));
        for (int k = 0; k < burst; ++k) {
          if (k + 1 < burst) {
            pending[(k + 1) % 2] = group.issue(memory, 0, bytes, static_cast<std::uint32_t>(k + 1),
                                               std::chrono::seconds(60));
          }
          group.wait(pending[k % 2]);
        }
        const double ferry_s = std::chrono::duration<double>(Clock::now() - t0).count() / burst;
        const auto t1 = Clock::now();
        for (int k = 0; k < burst; ++k) {
          plain.check(plain.broadcast(buffer, buffer, bytes, ncclUint8, 0, comm, stream),
                      "ncclBroadcast");
        }
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        const double plain_s = std::chrono::duration<double>(Clock::now() - t1).count() / burst;
        if (i > 0) {
          ferry_bursts.push_back(ferry_s);
          plain_bursts.push_back(plain_s);
        }
      }
      rows.push_back(Row{bytes, median_of(ferry_runs), median_of(plain_runs), median_of(nb_runs),
                         burst, median_of(ferry_bursts), median_of(plain_bursts)});
    }
    // Every rank checks what arrived: rank 0's 0x5a pattern.
    std::vector<std::uint8_t> probe(4096);
    check_cuda(cudaMemcpy(probe.data(), static_cast<std::uint8_t*>(buffer) + largest - 4096, 4096,
                          cudaMemcpyDeviceToHost),
               "read back");
    if (std::any_of(probe.begin(), probe.end(), [](std::uint8_t b) { return b != 0x5a; })) {
      fail(FERRY_STATUS_CORRUPT_DATA, "bench nccl: rank {} did not receive rank 0's bytes", rank);
    }
    cudaStreamDestroy(stream);
    plain.destroy(comm);
    plain.destroy(comm_nb);
  } catch (...) {
    for (pid_t pid : children) kill(pid, SIGTERM);
    for (pid_t pid : children) waitpid(pid, nullptr, 0);
    cudaFree(buffer);
    throw;
  }
  cudaFree(buffer);
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ferry bench nccl: a child rank (pid %d) failed\n", pid);
      code = 1;
    }
  }
  if (child) return code;

  std::printf("ferry bench nccl: %u ranks (one GPU each), NCCL_NVLS_ENABLE=%s, median of %d\n",
              world, std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)",
              options.repeat);
  std::printf("one bucket at a time (issue, wait); plain nb = the same ncclBroadcast on a "
              "non-blocking communicator like the plugin's\n");
  Table table({"bucket", "ferry ms", "ferry GB/s", "plain ms", "plain GB/s", "ferry/plain",
               "plain nb ms", "ferry/plain nb"});
  Table bursts({"bucket", "buckets", "ferry ms/bucket", "ferry GB/s", "plain ms/bucket",
                "plain GB/s", "ferry/plain"});
  for (const auto& r : rows) {
    const double ferry_bw = static_cast<double>(r.bytes) / r.ferry_s / 1e9;
    const double plain_bw = static_cast<double>(r.bytes) / r.plain_s / 1e9;
    const double nb_bw = static_cast<double>(r.bytes) / r.plain_nb_s / 1e9;
    const double ferry_burst_bw = static_cast<double>(r.bytes) / r.ferry_burst_s / 1e9;
    const double plain_burst_bw = static_cast<double>(r.bytes) / r.plain_burst_s / 1e9;
    table.add_row({binary_size(r.bytes), number(r.ferry_s * 1e3, 2), number(ferry_bw, 1),
                   number(r.plain_s * 1e3, 2), number(plain_bw, 1),
                   number(ferry_bw / plain_bw, 3), number(r.plain_nb_s * 1e3, 2),
                   number(ferry_bw / nb_bw, 3)});
    bursts.add_row({binary_size(r.bytes), std::to_string(r.burst),
                    number(r.ferry_burst_s * 1e3, 2), number(ferry_burst_bw, 1),
                    number(r.plain_burst_s * 1e3, 2), number(plain_burst_bw, 1),
                    number(ferry_burst_bw / plain_burst_bw, 3)});
    Json record = record_header("nccl", binary_size(r.bytes), Device::cuda);
    record["world_size"] = world;
    record["bytes"] = r.bytes;
    record["ferry_seconds"] = r.ferry_s;
    record["plain_seconds"] = r.plain_s;
    record["ferry_bus_gbps"] = ferry_bw;  // broadcast: bus bandwidth equals algorithm bandwidth
    record["plain_bus_gbps"] = plain_bw;
    record["ratio"] = ferry_bw / plain_bw;
    record["plain_nonblocking_seconds"] = r.plain_nb_s;
    record["burst_buckets"] = r.burst;
    record["ferry_burst_seconds_per_bucket"] = r.ferry_burst_s;
    record["plain_burst_seconds_per_bucket"] = r.plain_burst_s;
    record["burst_ratio"] = ferry_burst_bw / plain_burst_bw;
    records.push_back(record);
  }
  table.print();
  std::printf("\nbursts as an update runs them (ferry: two buckets in flight; plain: enqueued "
              "back to back, one sync), median per bucket\n");
  bursts.print();
  return code;
}

#else  // no NCCL in this build

int run_nccl_bench(const GlobalOptions&, const NcclBenchOptions& options, Json&) {
  for (const auto& s : options.sizes) parse_size(s);
  std::fprintf(stderr,
               "ferry bench nccl: this ferry was built without NCCL (-Dnccl needs CUDA and "
               "libnccl); nothing to measure\n");
  return 2;
}

#endif

NcclBenchCommand add_nccl_bench_command(CLI::App* bench, const GlobalOptions& globals) {
  CLI::App* nccl = bench->add_subcommand(
      "nccl", "broadcast through the nccl plugin vs plain ncclBroadcast (2+ GPUs)");
  auto o = std::make_shared<NcclBenchOptions>();
  nccl->add_option("--world-size", o->world_size, "ranks, one GPU each (default: every GPU)");
  nccl->add_option("--sizes", o->sizes, "bucket sizes (default 64MiB 256MiB 1GiB 4GiB)");
  nccl->add_option("--master-port", o->master_port,
                   "rank 0's rendezvous port; the baseline uses the next one (default 29517)");
  nccl->add_option("--repeat", o->repeat, "timed broadcasts per size (default 10)")
      ->check(CLI::PositiveNumber);
  nccl->add_option("--warmup", o->warmup, "untimed broadcasts first (default 3)");
  nccl->add_option("--json", o->json_path, "write the records (a JSON array) to FILE");
  nccl->add_option("--timeout", o->timeout_s, "give up after this many seconds (default 570)")
      ->check(CLI::PositiveNumber);
  Action action = [o, &globals]() -> int {
    Watchdog watchdog(o->timeout_s);
    Json records = Json::array();
    const int code = run_nccl_bench(globals, *o, records);
    // Child ranks return no records and must not overwrite rank 0's file.
    if (!o->json_path.empty() && !records.empty()) {
      write_records(o->json_path, records);
      std::printf("\nrecords written to %s\n", o->json_path.c_str());
    }
    return code;
  };
  return NcclBenchCommand{nccl, std::move(action)};
}

}  // namespace ferry::bench
