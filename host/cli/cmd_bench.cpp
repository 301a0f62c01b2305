// cli/cmd_bench.cpp: `ferry bench CASE ...`: the benchmarks are their own program, ferry-bench
// (bench/, installed to <libexecdir>/ferry beside ferry-plugin-vet), so that the shipped `ferry`
// carries none of their code. This command finds it (common/installed_program.hpp: the install or
// bundle holding ferry, then the build tree, then the configured prefix) and replaces itself with
// it, handing on this process's command line unchanged: ferry-bench parses the cases, their
// options and --help (bench/README.md).
#include <ferry/sdk/error.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/ferry_bench_program.h"
#include "common/installed_program.hpp"

namespace ferry::cli {

Action add_bench_command(CLI::App& app, const GlobalOptions&) {
  CLI::App* bench = app.add_subcommand(
      "bench", "measure the data-movement kernels against their ceilings and torch baselines");
  // Everything after `bench`, --help included, is ferry-bench's to parse (main() leaves
  // --parse-only to it too).
  bench->prefix_command();
  bench->set_help_flag();
  bench->fallthrough(false);
  return []() -> int {
    const InstalledProgram program{FERRY_BENCH_RELATIVE, FERRY_BENCH_BUILD};
    const auto found = find_program(program);
    if (!found) {
      fail(FERRY_STATUS_NOT_FOUND,
           "ferry bench: the benchmark program ferry-bench was not found (looked for {}); it is "
           "built with ferry (bench/meson.build) and installed beside ferry-plugin-vet",
           candidates_text(program_candidates(program)));
    }
    std::vector<std::string> args = own_arguments();
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(found->c_str(), argv.data());
    fail(FERRY_STATUS_IO, "ferry bench: cannot run {}: {}", found->string(), std::strerror(errno));
  };
}

}  // namespace ferry::cli
