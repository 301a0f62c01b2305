// bench/common/ferry_program.cpp: finding the ferry executable of this ferry-bench and the bench/
// scripts beside it (see ferry_program.hpp).
#include "bench/common/ferry_program.hpp"

#include <ferry/sdk/error.hpp>

#include <vector>

#include "bench/ferry_bench_paths.h"
#include "common/installed_program.hpp"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

InstalledProgram ferry_program_places() { return {FERRY_PROGRAM_RELATIVE, FERRY_PROGRAM_BUILD}; }

}  // namespace

const std::optional<fs::path>& ferry_program() {
  static const std::optional<fs::path> found = find_program(ferry_program_places());
  return found;
}

fs::path require_ferry_program(const std::string& why) {
  if (const auto& found = ferry_program()) return *found;
  fail(FERRY_STATUS_NOT_FOUND, "{}, but no ferry executable was found (looked for {})", why,
       candidates_text(program_candidates(ferry_program_places())));
}

std::string find_bench_script(const std::string& given, const std::string& name) {
  std::error_code ec;
  if (!given.empty()) return fs::exists(given, ec) ? given : "";
  std::vector<fs::path> candidates = {fs::current_path(ec) / "bench" / name};
  if (const auto& ferry = ferry_program()) {
    const fs::path dir = ferry->parent_path();
    candidates.push_back(dir / ".." / ".." / ".." / "bench" / name);
    candidates.push_back(dir / ".." / "bench" / name);
  }
  for (const fs::path& c : candidates) {
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  }
  return "";
}

}  // namespace ferry::bench
