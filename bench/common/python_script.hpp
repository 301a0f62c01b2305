// bench/common/python_script.hpp: runs one of bench/'s Python programs (embedded_push.py,
// sharded_push.py) as a child process for a `ferry bench` case: finds the script, sets
// PYTHONPATH and FERRY_LIBRARY so that it imports this ferry, captures its stdout (its stderr
// shows live), kills it at the watchdog's deadline, and reads the one JSON object it prints last:
// {"ok": true, ...}, {"ok": false, "unavailable": why} or {"ok": false, "error": why}.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/common/report.hpp"

namespace ferry::bench {

// The options every case that runs a script takes.
struct ScriptBenchOptions {
  std::string python = "python3";  // interpreter for the script
  std::string script;              // empty: searched (bench/README.md)
  std::string json_path;           // --json
  int timeout_s = 570;             // the watchdog's
};

// Adds --python, --script, --json and --timeout for bench/<name>.
void add_script_bench_options(CLI::App* app, ScriptBenchOptions* options, const std::string& name);

// Runs `run` (which appends its records) under a watchdog of options.timeout_s, then writes the
// records to --json; returns run's exit code.
int run_script_bench(const ScriptBenchOptions& options, const std::function<int(Json&)>& run);

// The last line of `text` that is not blank (where a child prints its JSON result).
std::string last_line(const std::string& text);

struct ScriptRun {
  std::string script;  // the script found ("" when none was)
  Json result;         // its JSON object when it ran and printed {"ok": true, ...}; else null
  // When result is null, what the bench command returns: 0 the script reported what it needs
  // unavailable (torch, CUDA...), 1 it failed, 2 it was not found.
  int exit_code = 0;
  bool ran() const { return result.is_object(); }
};

// Runs `python <script> args...` for `ferry bench <bench>`: the script is `given` when not empty,
// else bench/<name> where find_bench_script looks. Prints the command line; on a failure prints
// the reason and sets record["error"] (or record["unavailable"]); the caller keeps the record.
ScriptRun run_bench_script(const std::string& bench, const std::string& name,
                           const std::string& given, const std::string& python,
                           const std::vector<std::string>& args, Json& record);

// A number of a script's JSON row for a table: `key` in milliseconds (its value in seconds) or
// as a ratio with two decimals; "-" where the row has no number there.
std::string json_ms(const Json& row, const char* key);
std::string json_ratio(const Json& row, const char* key);

// The end of a case whose script ran (run.ran()): the record takes the device header (of the
// GPU when the script ran on one), `target`, `verified` and the script's `result`, and goes into
// `records`; returns 0 when the script verified its results, else 1.
int keep_script_result(const ScriptRun& run, const std::string& bench, const std::string& case_name,
                       double target, Json& record, Json& records);

}  // namespace ferry::bench
