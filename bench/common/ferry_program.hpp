// bench/common/ferry_program.hpp: the `ferry` executable this ferry-bench belongs to, and the
// files of bench/ found beside it. ferry-bench lives in <libexecdir>/ferry of an install or a
// bundle (bin/ferry beside it) or in <build>/bench (<build>/host/cli/ferry); `ferry bench`, the
// cuda_ipc case's `ferry serve` child, the plugin search and the Python scripts all go by where
// that ferry is, as they did when the cases were part of it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace ferry::bench {

// The ferry executable (common/installed_program.hpp's search), or nullopt when none is found.
const std::optional<std::filesystem::path>& ferry_program();

// The ferry executable; throws ferry::Error NOT_FOUND naming where it looked when there is none.
// `why` says what needs it ("bench cuda_ipc starts a `ferry serve` child").
std::filesystem::path require_ferry_program(const std::string& why);

// `given` when it is not empty (or "" when that file does not exist); else bench/<name> under the
// working directory, in the source tree of a build (<build>/host/cli/ferry -> ../../../bench) or
// in a bundle (bin/ferry -> ../bench): the first that exists, canonical, or "" when none does.
std::string find_bench_script(const std::string& given, const std::string& name);

}  // namespace ferry::bench
