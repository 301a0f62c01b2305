// bench/ucx/ucx_command.cpp: the `ferry bench ucx` subcommand: its options, the watchdog, loading
// the UCX plugin through the registry, and writing the JSON records.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/ucx/ucx.hpp"
#include "cli/context.hpp"

namespace ferry::bench {

UcxBenchCommand add_ucx_bench_command(CLI::App* bench, const GlobalOptions& globals) {
  auto o = std::make_shared<UcxBenchOptions>();
  auto sizes = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = bench->add_subcommand(
      "ucx", "buckets through the UCX plugin between two processes vs ucx_perftest (tcp, shm)");
  sub->add_option("--transports", o->transports,
                  "UCX transports to measure: tcp, tcp-none (tcp with error_mode = none), shm, "
                  "default (the plugin's default options, UCX_TLS unset; default "
                  "tcp,shm,default); with --device cuda also cuda_ipc (default cuda_ipc,tcp)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcp", "tcp-none", "shm", "default", "cuda_ipc"}));
  sub->add_option("--device", o->device,
                  "cpu: host buffers (default); cuda: GPU 0 buffers on both sides (needs a UCX "
                  "with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--sizes", *sizes, "bucket sizes, e.g. 1MiB,16MiB,256MiB,1GiB (the default)")
      ->delimiter(',');
  auto bytes_per_size = std::make_shared<std::string>();
  sub->add_option("--bytes-per-size", *bytes_per_size,
                  "bytes moved per size, e.g. 512MiB; iterations = this / size (default 1GiB)");
  sub->add_option("--min-iterations", o->min_iterations, "at least this many buckets (default 3)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--slots", o->slots,
                  "buckets in flight (default: 2, as a session's staging slots; 1 from 512 MiB)")
      ->check(CLI::Range(1, 8));
  sub->add_option("--max-iterations", o->max_iterations, "at most this many (default 200)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--primitive", o->primitive,
                  "auto (the plugin's choice, as the session makes it), put or tag (forced)")
      ->check(CLI::IsMember({"auto", "put", "tag"}));
  sub->add_option("--receiver-memory", o->receiver_memory,
                  "the receiver's host buffer: auto (allocated by the plugin where it offers "
                  "alloc_memory, as a session's slots are) or host (allocated by the bench)")
      ->check(CLI::IsMember({"auto", "host"}));
  sub->add_option("--perftest", o->perftest,
                  "the ucx_perftest program (default: the bundle's bin/ucx_perftest, of the UCX "
                  "it carries, else from PATH)");
  sub->add_flag("--no-perftest", o->no_perftest, "skip the ucx_perftest baselines");
  sub->add_option("--perftest-timeout", o->perftest_timeout_s,
                  "kill one ucx_perftest pair after this many seconds (default 120)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--json", o->json_path, "write the records (a JSON array) to FILE");
  sub->add_option("--timeout", o->timeout_s,
                  "give up (exit 3) after this many seconds, whatever hangs (default 570)")
      ->check(CLI::PositiveNumber);

  Action action = [o, sizes, bytes_per_size, &globals]() -> int {
    for (const auto& s : *sizes) o->sizes.push_back(parse_size(s));
    if (o->perftest.empty()) o->perftest = default_perftest();
    if (!bytes_per_size->empty()) o->bytes_per_size = parse_size(*bytes_per_size);
    Watchdog watchdog(o->timeout_s);
    Watchdog::phase("loading the UCX plugin");
    const auto config = load_config(globals);
    const auto registry = make_registry(globals, config);
    const auto plugin = registry->transport("ucx");  // NOT_FOUND names what was searched
    // The receiver process of a run (this program started again by the sender) stops here.
    if (const int receiver = run_ucx_receiver_if_asked(*o, *plugin->transport()); receiver >= 0) {
      return receiver;
    }
    Json records = Json::array();
    int code = 0;
    try {
      code = run_ucx_bench(*o, *plugin->transport(), records);
    } catch (...) {
      if (!o->json_path.empty() && !records.empty()) write_records(o->json_path, records);
      throw;
    }
    if (!o->json_path.empty()) {
      write_records(o->json_path, records);
      std::printf("\nrecords written to %s\n", o->json_path.c_str());
    }
    return code;
  };
  return {sub, std::move(action)};
}

}  // namespace ferry::bench
