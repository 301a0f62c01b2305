// cli/cmd_inspect.cpp: `ferry inspect PATH [--json]`: validates a safetensors checkpoint (file,
// index or directory) with the disk plugin's rules and lists its tensors, totals and metadata.
// An invalid checkpoint throws ferry::Error, which main prints (exit code 1).
#include <ferry/sdk/dtype.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.hpp"
#include <ferry/formats/safetensors.hpp>

namespace ferry::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool json = false;
};

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

std::map<std::string, std::uint64_t> bytes_by_dtype(const safetensors::Checkpoint& ck) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& file : ck.files) {
    for (const auto& t : file.tensors) out[dtype_name(t.dtype)] += t.size();
  }
  return out;
}

void print_json(const safetensors::Checkpoint& ck) {
  nlohmann::ordered_json doc;
  doc["path"] = ck.path;
  doc["index"] = ck.index_path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(ck.index_path);
  doc["files"] = nlohmann::ordered_json::array();
  for (const auto& file : ck.files) {
    nlohmann::ordered_json f;
    f["path"] = file.path;
    f["file_size"] = file.file_size;
    f["header_bytes"] = file.header_bytes;
    f["metadata"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : file.metadata) f["metadata"][key] = value;
    f["tensors"] = nlohmann::ordered_json::array();
    for (const auto& t : file.tensors) {
      nlohmann::ordered_json entry;
      entry["name"] = t.name;
      entry["dtype"] = dtype_name(t.dtype);
      entry["shape"] = t.shape;
      entry["bytes"] = t.size();
      entry["data_offsets"] = {t.begin, t.end};
      f["tensors"].push_back(std::move(entry));
    }
    doc["files"].push_back(std::move(f));
  }
  doc["tensor_count"] = ck.tensor_count();
  doc["total_bytes"] = ck.total_bytes();
  doc["bytes_by_dtype"] = bytes_by_dtype(ck);
  fmt::print("{}\n", doc.dump(2));
}

void print_text(const safetensors::Checkpoint& ck) {
  fmt::print("checkpoint {}\n", ck.path);
  if (!ck.index_path.empty()) fmt::print("index      {}\n", ck.index_path);
  for (const auto& file : ck.files) {
    fmt::print("\nfile {} ({} tensors, {}, header {} bytes)\n", file.path, file.tensors.size(),
               human_bytes(file.data_bytes()), file.header_bytes);
    for (const auto& [key, value] : file.metadata) {
      fmt::print("  __metadata__ {} = {}\n", key, value);
    }
    std::size_t name_width = 4;
    std::size_t shape_width = 5;
    for (const auto& t : file.tensors) {
      name_width = std::max(name_width, t.name.size());
      shape_width = std::max(shape_width, shape_string(t.shape).size());
    }
    fmt::print("  {:<{}}  {:<7}  {:<{}}  {:>14}\n", "name", name_width, "dtype", "shape",
               shape_width, "bytes");
    for (const auto& t : file.tensors) {
      fmt::print("  {:<{}}  {:<7}  {:<{}}  {:>14}\n", t.name, name_width, dtype_name(t.dtype),
                 shape_string(t.shape), shape_width, t.size());
    }
  }
  fmt::print("\ntotal: {} tensors, {} bytes ({}) in {} files\n", ck.tensor_count(),
             ck.total_bytes(), human_bytes(ck.total_bytes()), ck.files.size());
  for (const auto& [dtype, bytes] : bytes_by_dtype(ck)) {
    fmt::print("  {:<7} {:>14} bytes ({})\n", dtype, bytes, human_bytes(bytes));
  }
}

}  // namespace

Action add_inspect_command(CLI::App& app, const GlobalOptions& /*globals*/) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "validate a safetensors checkpoint (file, index or directory) and list it");
  sub->add_option("path", options->path, "a .safetensors file, an index json, or a directory")
      ->required();
  sub->add_flag("--json", options->json, "print JSON instead of a table");
  return [options] {
    const safetensors::Checkpoint ck = safetensors::read_checkpoint(options->path);
    if (options->json) {
      print_json(ck);
    } else {
      print_text(ck);
    }
    return 0;
  };
}

}  // namespace ferry::cli
