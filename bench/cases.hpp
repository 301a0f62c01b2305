// bench/cases.hpp: the `bench` command of ferry-bench and its cases (one folder each under
// bench/), as `ferry bench` has them.
#pragma once

#include <CLI/CLI.hpp>

#include "bench/common/case.hpp"

namespace ferry::bench {

// Adds the subcommand "bench" with every case to `app` (the root, which holds the global options)
// and returns the action that runs the chosen case (with no case: lists them). `globals` must
// outlive the action.
Action add_bench_command(CLI::App& app, const GlobalOptions& globals);

}  // namespace ferry::bench
