// cli/cmd_conformance.cpp: `ferry conformance PLUGIN.so [--json]`: runs the FERRY-ABI-n
// requirements against one plugin file and prints PASS/FAIL per requirement; exits 1 when any
// failed. `--list` prints the requirements.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "conformance/conformance.hpp"

namespace ferry::cli {
namespace {

struct ConformanceOptions {
  std::string plugin;
  bool json = false;
  bool list = false;
};

void print_report(const conformance::Report& report) {
  std::printf("conformance of %s\n", report.plugin.string().c_str());
  int counts[4] = {0, 0, 0, 0};
  for (const auto& r : report.results) {
    ++counts[static_cast<int>(r.outcome)];
    std::printf("%-4s  %-12s  %s\n", conformance::outcome_name(r.outcome), r.id.c_str(),
                r.detail.c_str());
  }
  std::printf("%zu requirements: %d passed, %d failed, %d skipped, %d not applicable -> %s\n",
              report.results.size(), counts[0], counts[1], counts[2], counts[3],
              report.passed() ? "CONFORMS" : "DOES NOT CONFORM");
}

void print_report_json(const conformance::Report& report) {
  nlohmann::ordered_json doc;
  doc["plugin"] = report.plugin.string();
  doc["passed"] = report.passed();
  doc["results"] = nlohmann::ordered_json::array();
  for (const auto& r : report.results) {
    doc["results"].push_back({{"id", r.id},
                              {"outcome", conformance::outcome_name(r.outcome)},
                              {"detail", r.detail},
                              {"requirement", r.requirement}});
  }
  std::printf("%s\n", doc.dump(2).c_str());
}

}  // namespace

Action add_conformance_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  auto options = std::make_shared<ConformanceOptions>();
  auto* sub = app.add_subcommand(
      "conformance",
      "check a plugin .so against the numbered ABI requirements (docs/plugin-abi.md)");
  sub->add_option("plugin", options->plugin,
                  "path of libferry_transport_<name>.so or "
                  "libferry_model_<name>.so");
  sub->add_flag("--json", options->json, "print JSON instead of text");
  sub->add_flag("--list", options->list, "print the requirements and exit");
  return [options] {
    if (options->list) {
      for (const auto& r : conformance::requirements()) std::printf("%-12s  %s\n", r.id, r.text);
      return 0;
    }
    if (options->plugin.empty()) {
      std::fprintf(stderr, "ferry conformance: give the plugin file (PLUGIN.so) or --list\n");
      return 2;
    }
    const auto report = conformance::run(options->plugin);
    if (options->json) {
      print_report_json(report);
    } else {
      print_report(report);
    }
    return report.passed() ? 0 : 1;
  };
}

}  // namespace ferry::cli
