// tests/control/fuzz_control.cpp: libFuzzer target over the control API's JSON request bodies.
// One in-process receiver (disk and dense plugins, a tiny dense checkpoint) behind a real
// ControlServer serves the whole run; each input's first byte picks a POST route, the rest is the
// body, sent on a new connection. Whatever the body, the answer must come within 10 s, be a JSON
// object (vLLM's /sleep and /wake_up: or an empty success, as vLLM answers) and never a 500: a
// client's mistake is a 4xx with "success": false and a "message" (or a 501 naming what this
// build lacks). Routes that rendezvous with a peer over the network (joining an NCCL group, a
// distributed update, checkpoint-engine sockets) are left out: their waiting is by design.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "config/config.hpp"
#include "control/http_server.hpp"
#include "raw_http.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace {

using namespace ferry;

const char* const kRoutes[] = {
    "/update_weights_from_disk",   "/get_weights_by_name",        "/update_weight_version",
    "/release_memory_occupation",  "/resume_memory_occupation",
    // SGLang's tensor and session routes (the restricted pickle reader behind base64 bodies).
    "/update_weights_from_tensor", "/begin_weight_update",        "/end_weight_update",
    "/pause_generation",           "/continue_generation",        "/weights_checker",
    "/destroy_weights_update_group",
    // vLLM's RL routes (without a weight-transfer group /update_weights is refused at once).
    "/start_weight_update",        "/update_weights",             "/finish_weight_update",
    "/pause",                      "/resume",                     "/sleep",
    "/wake_up",                    "/weight_checker",
};

struct Served {
  test::TempDir dir;
  config::Config config;
  std::unique_ptr<registry::Registry> registry;
  std::unique_ptr<receiver::Receiver> receiver;
  std::unique_ptr<control::ControlServer> server;
};
Served* g_served = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_served = new Served;  // serves until the process ends
  auto& s = *g_served;
  const test::Checkpoint v1 = test::make_dense_checkpoint(
      test::DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 3);
  test::write_checkpoint(s.dir.path() / "v1", v1, 1);
  s.config.receiver.model_family = "dense";
  s.registry = std::make_unique<registry::Registry>(
      std::vector<std::filesystem::path>{FERRY_FUZZ_DISK_PLUGIN_DIR, FERRY_FUZZ_DENSE_PLUGIN_DIR});
  s.receiver = std::make_unique<receiver::Receiver>(s.config, *s.registry);
  s.receiver->update_from_disk(s.dir.path() / "v1", std::string("v1"));
  control::ServerOptions options;
  options.port = 0;
  s.server = std::make_unique<control::ControlServer>(*s.receiver, options);
  s.server->start();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* route = kRoutes[data[0] % (sizeof kRoutes / sizeof kRoutes[0])];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  test::RawConnection c(g_served->server->port());
  c.send(std::string("POST ") + route + " HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n" +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body);
  const auto text = c.read_answer(std::chrono::seconds(10));
  if (!text) {
    std::fprintf(stderr, "fuzz_control: no answer from %s within 10 s\n", route);
    std::abort();
  }
  const test::RawAnswer a = test::parse_answer(*text);
  const bool error = a.status >= 400;
  // vLLM's /sleep and /wake_up answer a success with an empty body, as vLLM does.
  const std::string path(route);
  const bool empty_success = !error && (path == "/sleep" || path == "/wake_up") &&
                             text->ends_with("\r\n\r\n");
  if (empty_success) return 0;
  // 501 names what this build lacks (this target's build has no NCCL: /update_weights).
  const bool unimplemented = a.status == 501 && a.body.is_object() &&
                             a.body.value("code", std::string()) == "UNIMPLEMENTED";
  if (a.status == 0 || (a.status >= 500 && !unimplemented) || !a.body.is_object() ||
      (error && (a.body.value("success", true) || !a.body.contains("message")))) {
    std::fprintf(stderr, "fuzz_control: %s answered %d: %s\n", route, a.status, text->c_str());
    std::abort();
  }
  return 0;
}
