// cli/cmd_plugins.cpp: `ferry plugins [--json]`: lists the plugins the registry accepted (name,
// kind, ABI, capabilities, path) and every refused file with its reason.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/context.hpp"
#include "cli/plugin_search.hpp"
#include "registry/registry.hpp"

namespace ferry::cli {
namespace {

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& w : words) text += (text.empty() ? "" : ",") + w;
  return text;
}

void print_json(const registry::Registry& reg) {
  nlohmann::ordered_json doc;
  doc["search_dirs"] = nlohmann::ordered_json::array();
  for (const auto& dir : reg.search_dirs()) doc["search_dirs"].push_back(dir.string());
  doc["plugins"] = nlohmann::ordered_json::array();
  for (const auto& plugin : reg.plugins()) {
    const auto& info = plugin->info();
    nlohmann::ordered_json entry;
    entry["name"] = info.name;
    entry["kind"] = registry::kind_name(info.kind);
    entry["abi"] = fmt::format("{}.{}", info.abi_major, info.abi_minor);
    entry["version"] = info.version;
    entry["path"] = info.path.string();
    if (info.transport_caps) {
      entry["capabilities"] = capability_words(info.transport_caps->flags);
      entry["memory_kinds"] = memory_kind_words(info.transport_caps->memory_kinds);
      entry["preferred_bucket_bytes"] = info.transport_caps->preferred_bucket_bytes;
      entry["max_inflight_buckets"] = info.transport_caps->max_inflight_buckets;
    }
    doc["plugins"].push_back(std::move(entry));
  }
  doc["refused"] = nlohmann::ordered_json::array();
  for (const auto& refusal : reg.refused()) {
    doc["refused"].push_back({{"path", refusal.path.string()}, {"reason", refusal.reason}});
  }
  std::printf("%s\n", doc.dump(2).c_str());
}

void print_table(const registry::Registry& reg) {
  std::vector<std::vector<std::string>> rows{
      {"NAME", "KIND", "ABI", "VERSION", "CAPABILITIES", "MEMORY", "PATH"}};
  for (const auto& plugin : reg.plugins()) {
    const auto& info = plugin->info();
    const bool caps = info.transport_caps.has_value();
    rows.push_back({info.name, registry::kind_name(info.kind),
                    fmt::format("{}.{}", info.abi_major, info.abi_minor),
                    info.version.empty() ? "-" : info.version,
                    caps ? join(capability_words(info.transport_caps->flags)) : "-",
                    caps ? join(memory_kind_words(info.transport_caps->memory_kinds)) : "-",
                    info.path.string()});
  }
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += c + 1 < row.size() ? fmt::format("{:<{}}  ", row[c], widths[c]) : row[c];
    }
    std::printf("%s\n", line.c_str());
  }
  if (reg.plugins().empty()) {
    std::string dirs;
    for (const auto& dir : reg.search_dirs()) dirs += (dirs.empty() ? "" : ", ") + dir.string();
    std::printf("(no plugins found in %s)\n", dirs.c_str());
  }
  if (!reg.refused().empty()) {
    std::printf("refused:\n");
    for (const auto& refusal : reg.refused()) {
      std::printf("  %s: %s\n", refusal.path.string().c_str(), refusal.reason.c_str());
    }
  }
}

}  // namespace

Action add_plugins_command(CLI::App& app, const GlobalOptions& globals) {
  auto json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand(
      "plugins", "list the plugins found in the search path, and the files refused with why");
  sub->add_flag("--json", *json, "print JSON instead of a table");
  return [&globals, json] {
    const registry::Registry reg(plugin_search_path(globals, load_config(globals).plugin_dirs));
    if (*json) {
      print_json(reg);
    } else {
      print_table(reg);
    }
    return 0;
  };
}

}  // namespace ferry::cli
