// bench/common/case.hpp: what a `ferry bench` case is given and returns in ferry-bench
// (bench/cases.cpp): the global options of `ferry` (the same --config, --set, --plugin-dir and
// --log-level) and, for a case with its own options, the action that runs it.
#pragma once

#include <functional>

#include "cli/global_options.hpp"

namespace ferry::bench {

using cli::GlobalOptions;

// Runs a case; returns the process exit code. ferry::Error is caught by ferry-bench's main.
using Action = std::function<int()>;

}  // namespace ferry::bench
