// conformance/conformance.hpp: the plugin conformance suite. Runs the numbered ABI requirements
// (FERRY-ABI-n, documented in docs/plugin-abi.md) against one plugin file and reports each.
// A vendor runs it on their own .so with `ferry conformance PLUGIN.so`.
//
// The suite loads the plugin into the calling process and calls ferry_plugin_negotiate several
// times (a plugin must tolerate that); a plugin that crashes takes the process with it, which the
// CLI reports as a failure by its exit status. Not thread-safe: run one suite at a time.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ferry::conformance {

struct Requirement {
  const char* id;    // "FERRY-ABI-3"
  const char* text;  // one sentence: what a plugin must do
};

// Every requirement, in order.
const std::vector<Requirement>& requirements();

enum class Outcome {
  kPass,
  kFail,
  kSkipped,        // could not be checked because an earlier requirement failed
  kNotApplicable,  // does not apply to this kind of plugin
};
const char* outcome_name(Outcome outcome) noexcept;  // "PASS", "FAIL", "SKIP", "N/A"

struct Result {
  std::string id;
  std::string requirement;
  Outcome outcome = Outcome::kSkipped;
  std::string detail;  // why it failed, or what was observed
};

struct Report {
  std::filesystem::path plugin;
  std::vector<Result> results;  // one per requirement, in order

  // No requirement failed or was skipped.
  bool passed() const;
  // The result for `id`; throws ferry::Error NOT_FOUND for an unknown id.
  const Result& result(const std::string& id) const;
};

// Runs every requirement against `plugin`. Never throws for a bad plugin; a failure lands in the
// report.
Report run(const std::filesystem::path& plugin);

}  // namespace ferry::conformance
