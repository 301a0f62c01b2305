// bench/main.cpp: ferry-bench, the program behind `ferry bench` (bench/README.md). `ferry bench
// ...` runs it with its own command line, `ferry [GLOBAL OPTIONS] bench CASE [OPTIONS]`, so that
// the help, the errors, --parse-only and the command line in the JSON records read as they do for
// `ferry`; run alone it also takes `ferry-bench [GLOBAL OPTIONS] CASE [OPTIONS]`.
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "bench/common/ferry_program.hpp"
#include "cli/command_suggestion.hpp"
#include "cli/global_options.hpp"

int main(int argc, char** argv) {
  using namespace ferry;
  // Without the word `bench` (run alone) it is implied; global options are taken after it too.
  std::vector<char*> args(argv, argv + argc);
  static char bench_word[] = "bench";
  const auto word = cli::command_word(argc, argv);
  if (argc >= 1 && (!word || *word != "bench")) args.insert(args.begin() + 1, bench_word);

  CLI::App app{"ferry-bench: the benchmarks of `ferry bench`"};
  app.require_subcommand(1);
  cli::GlobalOptions globals;
  const CLI::Option* log_level = cli::add_global_options(app, globals);
  if (const auto& ferry = bench::ferry_program()) globals.ferry_exe = *ferry;
  const bench::Action action = bench::add_bench_command(app, globals);
  CLI11_PARSE(app, static_cast<int>(args.size()), args.data());
  if (globals.parse_only) {
    cli::print_parsed(app);
    return 0;
  }
  return cli::run_command(globals, *log_level, action);
}
