// tests/control/fuzz_control.cpp: libFuzzer target over the control API's JSON request bodies.
// One in-process receiver (disk and dense plugins, a tiny dense checkpoint) behind a real
// ControlServer serves the whole run; each input's first byte picks a POST route, the rest is the
// body, sent on a new connection. Whatever the body, the answer must come within 10 s, be a JSON
// object and never a 500: a client's mistake is a 4xx with "success": false and a "message". Routes
// that rendezvous with a peer over the network (NCCL groups, checkpoint-engine sockets) are left
// out: their waiting is by design.
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
    "/update_weights_from_disk",  "/get_weights_by_name",        "/update_weight_version",
    "/release_memory_occupation", "/resume_memory_occupation",
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
  if (a.status == 0 || a.status >= 500 || !a.body.is_object() ||
      (error && (a.body.value("success", true) || !a.body.contains("message")))) {
    std::fprintf(stderr, "fuzz_control: %s answered %d: %s\n", route, a.status, text->c_str());
    std::abort();
  }
  return 0;
}
