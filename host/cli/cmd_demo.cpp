// cli/cmd_demo.cpp: `ferry demo`: its options (each a demo.* config override), the config and the
// plugins; the loop itself is host/demo (sync_loop.hpp).
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/context.hpp"
#include "common/log.hpp"
#include "demo/sync_loop.hpp"

namespace ferry::cli {
namespace {

struct DemoOptions {
  std::optional<std::uint32_t> steps;
  std::optional<std::uint64_t> hidden_size, vocab_size;
  std::optional<std::uint32_t> layers;
  std::optional<std::string> transport, device, work_dir;
  bool keep = false;
};

// The arguments placed before "serve" so the receiver sees the same config and plugins.
std::vector<std::string> forwarded_globals(const GlobalOptions& globals) {
  std::vector<std::string> out;
  if (!globals.config_path.empty()) out.insert(out.end(), {"--config", globals.config_path});
  for (const auto& s : globals.overrides) out.insert(out.end(), {"--set", s});
  for (const auto& d : globals.plugin_dirs) out.insert(out.end(), {"--plugin-dir", d});
  const bool verbose = globals.log_level == "debug" || globals.log_level == "trace";
  out.insert(out.end(), {"--log-level", verbose ? globals.log_level : std::string("warn")});
  return out;
}

}  // namespace

Action add_demo_command(CLI::App& app, const GlobalOptions& globals) {
  auto* cmd = app.add_subcommand(
      "demo", "run a complete RL weight-sync loop on a synthetic Qwen3-shaped model, verified");
  auto opts = std::make_shared<DemoOptions>();
  cmd->add_option("--steps", opts->steps, "training steps (default: [demo] steps, 5)");
  cmd->add_option("--hidden-size", opts->hidden_size, "model hidden size (default: [demo] hidden_size)");
  cmd->add_option("--layers", opts->layers, "transformer layers (default: [demo] layers)");
  cmd->add_option("--vocab-size", opts->vocab_size, "vocabulary size (default: [demo] vocab_size)");
  cmd->add_option("--transport", opts->transport,
                  "auto, inline, disk or a point-to-point transport plugin (default: [demo] "
                  "transport; auto: the first of update.transport_preference that fits, else "
                  "inline)");
  cmd->add_option("--device", opts->device, "receiver weights on cpu, cuda or cuda:N");
  cmd->add_option("--work-dir", opts->work_dir,
                  "cache and scratch folder (default: $XDG_CACHE_HOME or ~/.cache, /ferry/demo-<shape>)");
  cmd->add_flag("--keep", opts->keep, "keep every step's checkpoint in the work folder");
  return [opts, &globals] {
    GlobalOptions g = globals;
    auto set = [&](const char* key, const std::string& value) {
      g.overrides.push_back(std::string(key) + "=" + value);
    };
    if (opts->steps) set("demo.steps", std::to_string(*opts->steps));
    if (opts->hidden_size) set("demo.hidden_size", std::to_string(*opts->hidden_size));
    if (opts->layers) set("demo.layers", std::to_string(*opts->layers));
    if (opts->vocab_size) set("demo.vocab_size", std::to_string(*opts->vocab_size));
    if (opts->transport) set("demo.transport", *opts->transport);
    if (opts->device) set("demo.device", *opts->device);
    const config::Config config = load_config(g);
    demo::check_device(config.demo.device);
    // The demo prints its own progress; the sender's and plugins' per-session info lines (which
    // transport and primitive, printed on every push) only with --log-level debug or trace.
    const bool verbose = globals.log_level == "debug" || globals.log_level == "trace";
    if (!verbose) set_log_level("warn");
    auto registry = make_registry(g, config);
    demo::DemoRun run{config, *registry, std::filesystem::read_symlink("/proc/self/exe"),
                      forwarded_globals(globals), {}, opts->keep};
    if (opts->work_dir) run.work_dir = *opts->work_dir;
    return demo::run(run);
  };
}

}  // namespace ferry::cli
