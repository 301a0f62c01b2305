// cli/cmd_serve.cpp: `ferry serve`: the standalone receiver host. Restores the last committed
// weights from a file-backed host mirror (memory.mirror_path) or loads the initial weights (if a
// model path is given) through the disk transport and the model plugin, then serves the HTTP
// control API until SIGTERM or SIGINT.
#include <ferry/sdk/error.hpp>

#include <csignal>
#include <fstream>
#include <iostream>
#include <optional>
#include <pthread.h>

#include "cli/command.hpp"
#include "cli/context.hpp"
#include "cli/token_option.hpp"
#include "common/log.hpp"
#include "receiver/receiver.hpp"
#include "session/receiver_endpoint.hpp"
#include "store/tagged_region_store.hpp"

namespace ferry::cli {
namespace {

struct ServeOptions {
  std::optional<std::string> model_path, host, device, model_family, layout, ready_file;
  std::optional<int> port;
  std::optional<unsigned> tp_rank, tp_size;
  // Test hook (hidden): store::TaggedRegionStore::delay_mirror_refreshes_for_tests.
  std::optional<std::uint64_t> test_mirror_refresh_delay_ms;
};

// Blocks SIGINT/SIGTERM in every thread started afterwards, so one sigwait() sees them.
sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

Action add_serve_command(CLI::App& app, const GlobalOptions& globals) {
  auto* cmd = app.add_subcommand("serve", "run a receiver: load weights, serve the HTTP control API");
  auto opts = std::make_shared<ServeOptions>();
  cmd->add_option("--model-path", opts->model_path, "safetensors file or folder to load first");
  cmd->add_option("--host", opts->host, "address to bind (default 127.0.0.1)");
  cmd->add_option("--port", opts->port, "port (default 30000; 0 picks a free one)");
  cmd->add_option("--device", opts->device, "cpu, cuda or cuda:N (default cpu)");
  auto token = add_token_options(*cmd, "bearer token required by mutating routes");
  cmd->add_option("--model-family", opts->model_family, "model plugin (default: from config.json)");
  cmd->add_option("--layout", opts->layout, "engine (fused) or hf (checkpoint names)");
  cmd->add_option("--tp-rank", opts->tp_rank, "tensor-parallel rank of this receiver");
  cmd->add_option("--tp-size", opts->tp_size, "tensor-parallel size");
  cmd->add_option("--ready-file", opts->ready_file,
                  "write the bound port to this file once serving (for scripts and tests)");
  cmd->add_option("--test-mirror-refresh-delay-ms", opts->test_mirror_refresh_delay_ms)->group("");
  return [opts, token, &globals] {
    if (opts->test_mirror_refresh_delay_ms) {
      store::TaggedRegionStore::delay_mirror_refreshes_for_tests(
          std::chrono::milliseconds(*opts->test_mirror_refresh_delay_ms));
    }
    GlobalOptions g = globals;
    auto set = [&](const char* key, const std::string& value) {
      g.overrides.push_back(std::string(key) + "=" + value);
    };
    if (opts->model_path) set("receiver.model_path", *opts->model_path);
    if (opts->host) set("receiver.host", *opts->host);
    if (opts->port) set("receiver.port", std::to_string(*opts->port));
    if (opts->device) set("receiver.device", *opts->device);
    if (opts->model_family) set("receiver.model_family", *opts->model_family);
    if (opts->layout) set("receiver.layout", *opts->layout);
    if (opts->tp_rank) set("receiver.tp_rank", std::to_string(*opts->tp_rank));
    if (opts->tp_size) set("receiver.tp_size", std::to_string(*opts->tp_size));
    config::Config config = load_config(g);
    // Not through the overrides: their messages quote the value.
    if (auto t = resolve_token(*token)) config.receiver.token = std::move(*t);
    const sigset_t stop_signals = block_stop_signals();
    auto registry = make_registry(g, config);
    receiver::Receiver receiver(config, *registry);
    // The control API and the session listener senders find through it (GET /ferry/session).
    session::ReceiverEndpoint server(receiver, config, *registry);
    server.start();
    // The last committed version from memory.mirror_path's file, else the initial checkpoint.
    try {
      receiver.start(config.receiver.model_path);
    } catch (const Error& e) {
      server.stop();
      if (config.receiver.model_path.empty()) throw;
      throw Error(e.code(), "initial load of '" + config.receiver.model_path + "' failed: " + e.what());
    }
    if (opts->ready_file) {
      std::ofstream(*opts->ready_file) << server.port() << "\n";
    }
    std::cout << "ferry serve: listening on http://" << config.receiver.host << ":" << server.port()
              << std::endl;
    int signal = 0;
    sigwait(&stop_signals, &signal);
    logger("serve")->info("signal {}: shutting down", signal);
    server.stop();
    return 0;
  };
}

}  // namespace ferry::cli
