// bench/common/report.hpp: what every `ferry bench` case shares: its options, timing statistics,
// the description of the machine and the run (for the JSON records), a plain-text table printer and
// the watchdog that turns a hang (a stuck kernel, a stuck baseline process) into a clear error.
#pragma once

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::bench {

using Json = nlohmann::ordered_json;

enum class Device { cpu, cuda };

const char* device_name(Device device) noexcept;

// The command-line options of `ferry bench <case>`. Zero / empty means "the default for the
// device" (resolved by each case).
struct BenchOptions {
  Device device = Device::cuda;
  std::string json_path;             // --json FILE: the records are written there
  int repeat = 0;                    // --repeat N: timed runs (the median is reported)
  int warmup = 0;                    // --warmup N: untimed runs before them
  std::uint64_t count = 0;           // --count N: tensors per scatter case
  std::string only;                  // --only NAME: one scatter case
  double gib = 0;                    // --gib N: fingerprint size
  std::string python = "python3";    // --python: interpreter for the torch baselines
  std::string torch_script;          // --torch-script: empty = search (baseline.cpp)
  bool no_torch = false;             // --no-torch: skip the baselines
  int baseline_timeout_s = 300;      // --baseline-timeout: kill the baseline process after it
  int timeout_s = 570;               // --timeout: the whole command gives up after it
};

// The median of `runs` (the mean of the two middle values for an even count); 0 when empty.
double median(std::vector<double> runs);

// Bytes as "28.99 GB" (decimal units, as bandwidths are) and sizes as "3 MiB" (binary units, as
// tensor sizes are usually stated).
std::string decimal_bytes(double bytes);
std::string binary_size(std::uint64_t bytes);
// A number with `digits` decimals, or "-" for a missing value.
std::string number(std::optional<double> value, int digits);

// The machine a record was measured on: host name, CPU model and count, and for CUDA the GPU
// name, memory, compute capability, the driver version and the CUDA runtime / driver API.
Json machine_description(Device device);

// The fields every JSON record starts with: bench, case, device, the command line (from
// /proc/self/cmdline), an ISO-8601 UTC timestamp and the machine.
Json record_header(const std::string& bench, const std::string& case_name, Device device);

// Writes `records` (a JSON array, one object per case) to `path`; throws ferry::Error (IO) naming
// the file when it cannot be written.
void write_records(const std::string& path, const Json& records);

// A plain-text table: columns are right-aligned except the first.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);
  void print() const;  // to stdout

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// Ends the process with a clear message when a bench takes longer than its limit: a hung CUDA
// call or baseline process must never hang the lead's GPU session. One per process; the phase
// and the child process are published through the static functions from any thread.
class Watchdog {
 public:
  explicit Watchdog(int seconds);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // What the bench is doing now (a string literal; named in the timeout message).
  static void phase(const char* what) noexcept;
  // The baseline process to kill on timeout (0: none).
  static void set_child(pid_t pid) noexcept;
  // Seconds left before the watchdog fires (a large number when none is running).
  static double seconds_left() noexcept;
};

}  // namespace ferry::bench
