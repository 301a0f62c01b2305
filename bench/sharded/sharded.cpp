// bench/sharded/sharded.cpp: `ferry bench sharded` (see sharded.hpp): runs bench/sharded_push.py
// (bench/common/python_script.hpp) with this ferry as its receivers' executable, then prints the
// table and appends the record.
#include "bench/sharded/sharded.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "bench/common/ferry_program.hpp"
#include "bench/common/python_script.hpp"

namespace ferry::bench {
namespace {

constexpr double kTarget = 0.70;  // the target for 4 senders on the H200

void print_result(const Json& d) {
  const double bytes = d.value("model_bytes", 0.0);
  fmt::print("\nbench sharded: {} layers, {} tensors, {} ({}) of bf16 into {} receivers{} on {}; "
             "transport {}; {} rounds per row{}\n",
             d.value("layers", 0), d.value("tensors", 0), decimal_bytes(bytes),
             binary_size(static_cast<std::uint64_t>(bytes)), d.value("receivers", 0),
             d.value("tp", false) ? " (tensor-parallel ranks)" : "",
             d.value("device_name", std::string("?")), d.value("transport", std::string("?")),
             d.value("rounds", 0),
             d.value("lend", false) ? ", each after the receivers released and resumed" : "");
  Table table({"senders", "sharded ms (median)", "best ms", "round ms", "GB/s", "one sender ms",
               "sharded / one",
               "of D2D", "one sender of D2D", "moved / needed", "direct",
               "last rank began ms", "slowest push() ms", "transports"});
  if (d.contains("rows") && d["rows"].is_array()) {
    for (const Json& row : d["rows"]) {
      std::string transports;
      for (const auto& t : row.value("transports", Json::array())) {
        transports += (transports.empty() ? "" : ",") + t.get<std::string>();
      }
      table.add_row(
          {std::to_string(row.value("senders", 0)), json_ms(row, "sharded_median_s"),
           json_ms(row, "sharded_best_s"), json_ms(row, "round_median_s"),
           json_ratio(row, "gb_per_s"), json_ms(row, "whole_median_s"), json_ratio(row, "vs_whole"),
           json_ratio(row, "of_d2d"), json_ratio(row, "whole_of_d2d"),
           fmt::format("{:.3f}", row.value("moved_over_needed", 0.0)),
           row.value("direct", false) ? "yes" : "no", json_ms(row, "last_rank_start_median_s"),
           json_ms(row, "slowest_rank_push_median_s"), transports});
    }
  }
  std::printf("\n");
  table.print();
  fmt::print(
      "\nsharded ms: from the first rank's push() call to the last rank's return (what a trainer "
      "waits); round ms:\nfrom this bench telling the ranks to push, through their pipes, to "
      "the last answer.\nGB/s: the bytes all receivers took over the sharded push's median "
      "time. sharded / one: the one-sender\npush's time over the sharded push's (above 1: faster). "
      "of D2D: the device copy\nof the bytes the receivers took, over the push's time; target >= "
      "{:.2f} with 4 senders. moved / needed: the\nlargest of a receiver (1: every byte it needs "
      "once, nothing else). last rank began: how long after the\npush command the last rank "
      "read it (medians); slowest push(): the longest push() of a rank.\n"
      "verification: {}\n",
      kTarget, d.value("verification", std::string("?")));
}

}  // namespace

int run_sharded_bench(const ShardedBenchOptions& o, Json& records) {
  Json record = record_header("sharded", fmt::format("qwen3-8b-dims-{}-layers", o.layers),
                              Device::cpu);
  record["senders"] = o.senders;
  record["receivers"] = o.receivers;
  record["tp"] = o.tp;
  record["layers"] = o.layers;
  record["transport"] = o.transport;
  record["bucket_mib"] = o.bucket_mib;
  record["delivery"] = o.delivery;
  record["whole_delivery"] = o.whole_delivery;
  record["receiver_family"] = o.receiver_family;
  record["kept"] = !o.no_keep;
  record["lend"] = o.lend;
  const std::string ferry = require_ferry_program("bench sharded starts `ferry serve` receivers")
                                .string();
  std::vector<std::string> args = {"--senders",        o.senders,
                                   "--receivers",      std::to_string(o.receivers),
                                   "--layers",         std::to_string(o.layers),
                                   "--rounds",         std::to_string(o.rounds),
                                   "--transport",      o.transport,
                                   "--bucket-mib",     std::to_string(o.bucket_mib),
                                   "--delivery",       o.delivery,
                                   "--whole-delivery", o.whole_delivery,
                                   "--device",         o.device,
                                   "--ferry",          ferry,
                                   "--no-table"};
  if (o.no_keep) args.push_back("--no-keep");
  if (o.lend) args.push_back("--lend");
  if (o.tp) args.push_back("--tp");
  if (!o.receiver_family.empty()) args.insert(args.end(), {"--receiver-family", o.receiver_family});
  if (!o.log_dir.empty()) {
    args.push_back("--log-dir");
    args.push_back(o.log_dir);
  }
  const ScriptRun run = run_bench_script("sharded", "sharded_push.py", o.script, o.python,
                                         args, record);
  if (run.exit_code == 2) return 2;
  if (!run.ran()) {
    records.push_back(record);
    return run.exit_code;
  }
  print_result(run.result);
  return keep_script_result(run, "sharded", fmt::format("qwen3-8b-dims-{}-layers", o.layers),
                            kTarget, record, records);
}

ShardedBenchCommand add_sharded_bench_command(CLI::App* bench) {
  CLI::App* app = bench->add_subcommand(
      "sharded",
      "a sharded trainer's push (S sender processes holding dim-0 shards of a Qwen3-shaped "
      "model) vs one sender holding it whole, into R ferry serve receivers");
  auto o = std::make_shared<ShardedBenchOptions>();
  app->add_option("--senders", o->senders, "sender counts, comma-separated (1,2,4)");
  app->add_option("--receivers", o->receivers, "ferry serve receivers (2)")
      ->check(CLI::PositiveNumber);
  app->add_flag("--tp", o->tp,
               "the receivers are one engine's tensor-parallel ranks (dense engine layout, "
               "tp_size = --receivers): each takes only what its plan reads");
  app->add_option("--layers", o->layers, "decoder layers (36: Qwen3-8B, 16.38 GB of bf16)")
      ->check(CLI::PositiveNumber);
  app->add_option("--rounds", o->rounds, "pushes per sender count (3)")
      ->check(CLI::PositiveNumber);
  app->add_option("--transport", o->transport, "the senders' transport (auto)");
  app->add_option("--bucket-mib", o->bucket_mib,
                  "the sender ranks' bucket size in MiB (0: ferry's default, 256 MiB or the "
                  "largest block)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--delivery", o->delivery,
                  "the sender ranks' update.delivery: auto or direct (their pieces straight into "
                  "the receivers' parameters where the transport writes device memory) or "
                  "staged")
      ->check(CLI::IsMember({"auto", "direct", "staged"}));
  app->add_option("--whole-delivery", o->whole_delivery,
                  "the one sender's update.delivery: auto (straight into the receivers' "
                  "parameters where every plan is a copy, else read in place by the receivers "
                  "where the transport maps the sender's memory, else staged), direct or staged")
      ->check(CLI::IsMember({"auto", "direct", "staged"}));
  app->add_option("--receiver-family", o->receiver_family,
                  "the receivers' model family (default: dense with --tp, else identity; lowbit: "
                  "FP8 block quantisation on arrival)");
  app->add_flag("--no-keep", o->no_keep,
               "the sender ranks open new sessions for every push instead of keeping them");
  app->add_flag("--lend", o->lend,
               "before each round every receiver releases and resumes its memory (the colocated "
               "loop's lend): the kept sessions are suspended, and the round's pushes rejoin them");
  app->add_option("--device", o->device, "cuda, or cpu (host tensors of a tiny model)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app->add_option("--log-dir", o->log_dir,
                  "keep every receiver's and sender rank's log here, at debug level (where the "
                  "time goes)");
  add_script_bench_options(app, o.get(), "sharded_push.py");
  Action action = [o]() -> int {
    return run_script_bench(*o, [&](Json& records) { return run_sharded_bench(*o, records); });
  };
  return {app, action};
}

}  // namespace ferry::bench
