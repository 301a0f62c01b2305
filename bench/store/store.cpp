// bench/store/store.cpp: `ferry bench store` (store.hpp; built with the cuda feature): times the
// CUDA weight store's release and resume, without backup (N GiB) and with backup through the
// page-locked host mirror (M GiB), against a plain pinned cudaMemcpy of the same bytes measured in
// the same run; prints a table and writes JSON.
//
// N defaults to 100 (less when the device has less free memory), M to 64 (the mirror needs M GiB
// of host RAM, page-locked), C to 1024, R to 5. --export 0 creates chunks without POSIX file
// descriptor export. Without backup, resume is timed twice: right after the release, and S ms
// (default 2000) after it: the driver scrubs freed device memory for a while after cuMemRelease,
// and memory created before that finishes waits for it (resume 100 GiB: ~180 ms right after the
// release, ~40 ms once settled, on the H200). Times are steady_clock around calls that return
// only when the device work is done (release synchronizes, resume maps synchronously, copies
// wait on their streams); the baseline copies are single cudaMemcpy calls timed the same way.
#include "bench/store/store.hpp"

#include "store/cuda_weight_store.hpp"
#include "store/host_mirror.hpp"

#include <ferry/sdk/error.hpp>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ferry::bench {
namespace {

using store::CudaWeightStore;
using store::CudaWeightStoreOptions;
using store::Policy;

constexpr std::uint64_t kGiB = 1ull << 30;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(FERRY_STATUS_INTERNAL, "{}: {}", what, cudaGetErrorString(err));
  }
}

std::uint64_t free_device_bytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return free_bytes;
}

template <typename Body>
double seconds(Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The upper median (the middle value; of the two middle ones, the larger).
double upper_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Weights of `bytes` in `weights` as 1 GiB parameters (the last one shorter), each filled with a
// distinct byte so a restore that misplaces or drops a parameter is caught.
// `create_seconds` receives the time of create_region alone (reserve + map).
std::vector<std::size_t> place_weights(CudaWeightStore& store, std::uint64_t bytes, Policy policy,
                                       double* create_seconds = nullptr) {
  const double t = seconds([&] { store.create_region("weights", bytes, policy); });
  if (create_seconds != nullptr) *create_seconds = t;
  std::vector<std::size_t> params;
  for (std::uint64_t at = 0, i = 0; at < bytes; at += kGiB, ++i) {
    const std::uint64_t shape[] = {std::min(kGiB, bytes - at)};
    params.push_back(
        store.place("weights", fmt::format("layer.{}.weight", i), FERRY_DTYPE_U8, shape));
    const auto info = store.param(params.back());
    check(cudaMemset(info.data, static_cast<int>(i % 251 + 1), info.bytes), "cudaMemset");
  }
  check(cudaDeviceSynchronize(), "filling the weights");
  return params;
}

// Checks the first and last byte of every parameter against its fill value.
void verify(const CudaWeightStore& store, const std::vector<std::size_t>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto info = store.param(params[i]);
    unsigned char edges[2] = {0, 0};
    check(cudaMemcpy(&edges[0], info.data, 1, cudaMemcpyDeviceToHost), "reading back");
    check(cudaMemcpy(&edges[1], info.data + info.bytes - 1, 1, cudaMemcpyDeviceToHost),
          "reading back");
    const auto want = static_cast<unsigned char>(i % 251 + 1);
    if (edges[0] != want || edges[1] != want) {
      fail(FERRY_STATUS_CORRUPT_DATA, "parameter '{}' lost its contents ({} {} != {})",
                  info.name, edges[0], edges[1], want);
    }
  }
}

struct Row {
  std::string what;
  std::uint64_t bytes = 0;
  std::vector<double> runs;
  double gbps() const {
    const double m = upper_median(runs);
    return m > 0 ? static_cast<double>(bytes) / m / 1e9 : 0;
  }
};

nlohmann::json to_json(const Row& row) {
  return {{"what", row.what},
          {"bytes", row.bytes},
          {"seconds", row.runs},
          {"median_s", upper_median(row.runs)},
          {"gb_per_s", row.gbps()}};
}

}  // namespace

int run_store_bench(const StoreBenchOptions& args) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  check(cudaFree(nullptr), "initializing CUDA");

  CudaWeightStoreOptions options;
  options.chunk_bytes = args.chunk_mib << 20;
  options.exportable = args.exportable;
  const std::uint64_t headroom = 4 * kGiB;
  const std::uint64_t free_start = free_device_bytes();
  const std::uint64_t asked = static_cast<std::uint64_t>(args.gib * static_cast<double>(kGiB));
  const std::uint64_t plain_bytes =
      std::min(asked, free_start > headroom ? free_start - headroom : 0);
  const std::uint64_t asked_backup =
      static_cast<std::uint64_t>(args.backup_gib * static_cast<double>(kGiB));
  const std::uint64_t backup_bytes = std::min(asked_backup, plain_bytes);
  const std::vector<std::string> tags = {"weights"};

  std::vector<Row> rows;
  nlohmann::json report;
  report["device"] = prop.name;
  report["chunk_bytes"] = options.chunk_bytes;
  report["repeat"] = args.repeat;
  report["exportable"] = args.exportable;
  report["settle_ms"] = args.settle_ms;

  // ---- no backup: release / resume of the whole tag ----------------------------------------
  if (plain_bytes > 0) {
    CudaWeightStore store(options);
    Row create{"create region (reserve + map)", plain_bytes, {0.0}};
    const auto params = place_weights(store, plain_bytes, Policy::Discard, &create.runs[0]);
    const auto address = store.param(params.front()).data;
    Row release{"release, no backup", plain_bytes, {}};
    Row resume_now{"resume right after release, no backup", plain_bytes, {}};
    Row resume_settled{
        fmt::format("resume {} ms after release, no backup", args.settle_ms), plain_bytes, {}};
    std::uint64_t returned = 0;
    for (int r = 0; r < args.repeat; ++r) {
      const std::uint64_t before = free_device_bytes();
      release.runs.push_back(seconds([&] { store.release(tags); }));
      returned = free_device_bytes() - before;
      resume_now.runs.push_back(seconds([&] { store.resume(tags); }));
      release.runs.push_back(seconds([&] { store.release(tags); }));
      std::this_thread::sleep_for(std::chrono::milliseconds(args.settle_ms));
      resume_settled.runs.push_back(seconds([&] { store.resume(tags); }));
    }
    if (store.param(params.front()).data != address) {
      fail(FERRY_STATUS_INTERNAL, "resume moved the weights");
    }
    report["no_backup"] = {{"bytes", plain_bytes},
                           {"returned_to_device_bytes", returned},
                           {"chunk_bytes", store.chunk_bytes()},
                           {"granularity", store.granularity()}};
    rows.push_back(create);
    rows.push_back(release);
    rows.push_back(resume_now);
    rows.push_back(resume_settled);
  }

  // ---- backup: through the page-locked host mirror -----------------------------------------
  if (backup_bytes > 0) {
    CudaWeightStore store(options);
    const auto params = place_weights(store, backup_bytes, Policy::Backup);
    Row first{"first release (creates + pins mirror)", backup_bytes, {}};
    first.runs.push_back(seconds([&] { store.release(tags); }));
    store.resume(tags);
    verify(store, params);
    Row release{"release with backup (D2H + unmap)", backup_bytes, {}};
    Row resume{"resume with backup (map + H2D)", backup_bytes, {}};
    Row save{"save to mirror only (D2H)", backup_bytes, {}};
    Row restore{"restore from mirror only (H2D)", backup_bytes, {}};
    Row plain_d2h{"baseline cudaMemcpy D2H, pinned", backup_bytes, {}};
    Row plain_h2d{"baseline cudaMemcpy H2D, pinned", backup_bytes, {}};
    const auto mirror = store.mirror();
    std::byte* host = mirror->data_area();
    std::byte* device = store.param(params.front()).data;
    // The weights are one contiguous region and the mirror one contiguous area: the baseline
    // moves the same bytes between the same memory in one call each way.
    const std::uint64_t span = std::min(mirror->data_bytes(), store.memory_state().front().bytes);
    for (int r = 0; r < args.repeat; ++r) {
      release.runs.push_back(seconds([&] { store.release(tags); }));
      resume.runs.push_back(seconds([&] { store.resume(tags); }));
      save.runs.push_back(seconds([&] { store.save_to_mirror(tags); }));
      restore.runs.push_back(seconds([&] { store.restore_from_mirror(tags); }));
      plain_d2h.runs.push_back(seconds(
          [&] { check(cudaMemcpy(host, device, span, cudaMemcpyDeviceToHost), "baseline D2H"); }));
      plain_h2d.runs.push_back(seconds(
          [&] { check(cudaMemcpy(device, host, span, cudaMemcpyHostToDevice), "baseline H2D"); }));
    }
    verify(store, params);
    report["backup"] = {
        {"bytes", backup_bytes},
        {"pinned_mirror_bytes", store.pinned_mirror_bytes()},
        {"release_vs_plain_d2h", plain_d2h.gbps() > 0 ? release.gbps() / plain_d2h.gbps() : 0},
        {"resume_vs_plain_h2d", plain_h2d.gbps() > 0 ? resume.gbps() / plain_h2d.gbps() : 0},
        {"save_vs_plain_d2h", plain_d2h.gbps() > 0 ? save.gbps() / plain_d2h.gbps() : 0},
        {"restore_vs_plain_h2d", plain_h2d.gbps() > 0 ? restore.gbps() / plain_h2d.gbps() : 0}};
    for (Row* row : {&first, &release, &resume, &save, &restore, &plain_d2h, &plain_h2d}) {
      rows.push_back(*row);
    }
  }

  std::printf("ferry bench store on %s, chunks of %llu MiB%s, %d repeats (median)\n", prop.name,
              static_cast<unsigned long long>(args.chunk_mib),
              args.exportable ? ", fd-exportable" : "", args.repeat);
  std::printf("%-44s %8s %12s %10s\n", "what", "GiB", "median ms", "GB/s");
  for (const auto& row : rows) {
    std::printf("%-44s %8.2f %12.3f %10.2f\n", row.what.c_str(),
                static_cast<double>(row.bytes) / kGiB, upper_median(row.runs) * 1e3, row.gbps());
    report["rows"].push_back(to_json(row));
  }
  if (report.contains("backup")) {
    std::printf(
        "backup vs plain pinned cudaMemcpy: release %.2f, resume %.2f, save %.2f, "
        "restore %.2f\n",
        report["backup"]["release_vs_plain_d2h"].get<double>(),
        report["backup"]["resume_vs_plain_h2d"].get<double>(),
        report["backup"]["save_vs_plain_d2h"].get<double>(),
        report["backup"]["restore_vs_plain_h2d"].get<double>());
  }
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    out << report.dump(2) << "\n";
    if (!out) fail(FERRY_STATUS_IO, "cannot write {}", args.json);
  }
  return 0;
}

}  // namespace ferry::bench
