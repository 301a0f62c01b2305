// The HTTP/JSON control server of the receiver (see control/http_server.hpp).
#include "control/http_server.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <atomic>
#include <chrono>
#include <thread>

#include "common/log.hpp"
#include "receiver/receiver.hpp"
#include "receiver/receiver_ckpt.hpp"
#include "receiver/receiver_nccl.hpp"

namespace ferry::control {
namespace {

using nlohmann::json;

const std::vector<Route> kRoutes = {
    {"POST", "/update_weights_from_disk", true, "reload weights from a safetensors path"},
    {"POST", "/init_weights_update_group", true, "join an NCCL weight-update group (rank 0: trainer)"},
    {"POST", "/update_weights_from_distributed", true, "receive one update by NCCL broadcast"},
    {"POST", "/destroy_weights_update_group", true, "leave and destroy an NCCL weight-update group"},
    {"POST", "/update_weights_from_ipc", true, "receive one update from a checkpoint-engine ParameterServer"},
    {"POST", "/get_weights_by_name", false, "dtype, shape and first values of a checkpoint tensor"},
    {"POST", "/update_weight_version", true, "set the weight_version label"},
    {"GET", "/get_weight_version", false, "the published weight version"},
    {"POST", "/release_memory_occupation", true, "release memory of the given tags"},
    {"POST", "/resume_memory_occupation", true, "resume memory of the given tags"},
    {"GET", "/get_model_info", false, "model family, layout, parallelism and version"},
    {"GET", "/get_fingerprints", false, "fingerprint of every parameter (docs/fingerprint.md)"},
    {"GET", "/health", false, "200 when ready to serve, 503 with the reason otherwise"},
    {"GET", "/metrics", false, "Prometheus text metrics"},
    {"GET", "/ferry/session", false, "where senders open a session (docs/session-protocol.md)"},
};

int http_status(ferry_status_code_t code) {
  switch (code) {
    case FERRY_STATUS_INVALID_ARGUMENT:
    case FERRY_STATUS_CORRUPT_DATA:
    case FERRY_STATUS_INCOMPATIBLE: return 400;
    case FERRY_STATUS_NOT_FOUND: return 404;
    case FERRY_STATUS_FAILED_PRECONDITION: return 409;
    case FERRY_STATUS_UNIMPLEMENTED: return 501;
    case FERRY_STATUS_TIMEOUT: return 504;
    case FERRY_STATUS_OUT_OF_MEMORY: return 507;
    case FERRY_STATUS_PEER_FAILED: return 502;
    case FERRY_STATUS_ABORTED: return 409;
    default: return 500;
  }
}

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void reply_error(httplib::Response& res, ferry_status_code_t code, const std::string& message) {
  reply(res, http_status(code),
        json{{"success", false}, {"message", message}, {"code", status_name(code)}});
}

// Parses the request body as a JSON object; an empty body is an empty object.
json parse_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) fail(FERRY_STATUS_INVALID_ARGUMENT, "request body is not valid JSON");
  if (!body.is_object()) fail(FERRY_STATUS_INVALID_ARGUMENT, "request body must be a JSON object");
  return body;
}

template <typename T>
T field(const json& body, const char* key, T fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' has the wrong type ({})", key, it->type_name());
  }
}

std::string required_string(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' (non-empty string) is required", key);
  }
  return it->get<std::string>();
}

// SGLang accepts the weight version as a string; numbers are accepted and stringified.
std::optional<std::string> optional_label(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return std::to_string(it->get<long long>());
  fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be a string", key);
}

std::vector<std::string> tags_field(const json& body) {
  auto it = body.find("tags");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_array()) fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'tags' must be a list of strings");
  std::vector<std::string> tags;
  for (const auto& t : *it) {
    if (!t.is_string()) fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'tags' must be a list of strings");
    tags.push_back(t.get<std::string>());
  }
  return tags;
}

json report_json(const receiver::UpdateReport& r) {
  return json{{"weight_version", r.version.label}, {"version", r.version.number},
              {"bytes", r.bytes},  {"tensors", r.tensors}, {"buckets", r.buckets},
              {"seconds", r.seconds}};
}

bool token_matches(const std::string& header, const std::string& token) {
  const std::string expected = "Bearer " + token;
  if (header.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the token length
  for (std::size_t i = 0; i < header.size(); ++i) {
    diff |= static_cast<unsigned char>(header[i] ^ expected[i]);
  }
  return diff == 0;
}

}  // namespace

const std::vector<Route>& routes() { return kRoutes; }

struct ControlServer::Impl {
  receiver::Receiver& receiver;
  ServerOptions options;
  httplib::Server server;
  std::thread thread;
  int bound_port = -1;
  std::atomic<bool> listen_returned{false};
  receiver::WeightUpdateGroups groups{receiver};  // NCCL groups (receiver/receiver_nccl.hpp)

  Impl(receiver::Receiver& r, ServerOptions o) : receiver(r), options(std::move(o)) {}

  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // Wraps a handler with authentication and error translation.
  Handler wrap(const Route& route, Handler body) {
    return [this, &route, body](const httplib::Request& req, httplib::Response& res) {
      if (route.mutating && !options.token.empty() &&
          !token_matches(req.get_header_value("Authorization"), options.token)) {
        res.set_header("WWW-Authenticate", "Bearer");
        reply(res, 401, json{{"success", false},
                             {"message", "this route needs 'Authorization: Bearer <token>'"}});
        return;
      }
      try {
        body(req, res);
      } catch (const Error& e) {
        logger("control")->warn("{} {}: {}", route.method, route.path, e.what());
        reply_error(res, e.code(), e.what());
      } catch (const std::exception& e) {
        logger("control")->error("{} {}: {}", route.method, route.path, e.what());
        reply_error(res, FERRY_STATUS_INTERNAL, e.what());
      }
    };
  }

  Handler handler_for(const std::string& path) {
    if (path == "/update_weights_from_disk") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        json body = parse_body(req);
        auto report = receiver.update_from_disk(required_string(body, "model_path"),
                                                optional_label(body, "weight_version"));
        json out = report_json(report);
        out["success"] = true;
        out["message"] = "updated from disk";
        out["num_paused_requests"] = 0;
        reply(res, 200, out);
      };
    }
    if (path == "/get_weights_by_name") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        json body = parse_body(req);
        const auto truncate = field<long long>(body, "truncate_size", 100);
        if (truncate < 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "truncate_size must be >= 0");
        auto w = receiver.weights_by_name(required_string(body, "name"),
                                          static_cast<std::size_t>(truncate));
        reply(res, 200, json{{"name", w.name}, {"dtype", dtype_name(w.dtype)},
                             {"shape", w.shape}, {"values", w.values}});
      };
    }
    if (path == "/update_weight_version") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        json body = parse_body(req);
        auto label = optional_label(body, "new_version");
        if (!label) fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'new_version' is required");
        receiver.set_version_label(*label);
        reply(res, 200, json{{"success", true}, {"message", "weight version updated"},
                             {"new_version", *label}});
      };
    }
    if (path == "/get_weight_version") {
      return [this](const httplib::Request&, httplib::Response& res) {
        auto v = receiver.version();
        reply(res, 200, json{{"weight_version", v.label}, {"version", v.number}});
      };
    }
    if (path == "/release_memory_occupation" || path == "/resume_memory_occupation") {
      const bool release = path == "/release_memory_occupation";
      return [this, release](const httplib::Request& req, httplib::Response& res) {
        json body = parse_body(req);
        auto tags = tags_field(body);
        if (release) {
          receiver.release(tags);
        } else {
          receiver.resume(tags);
        }
        json state = json::array();
        for (const auto& t : receiver.memory_state()) {
          state.push_back(json{{"tag", t.tag}, {"bytes", t.bytes}, {"released", t.released},
                               {"policy", t.policy}, {"contents_valid", t.contents_valid}});
        }
        reply(res, 200, json{{"success", true},
                             {"message", release ? "memory released" : "memory resumed"},
                             {"memory", state}});
      };
    }
    if (path == "/get_model_info") {
      return [this](const httplib::Request&, httplib::Response& res) {
        auto v = receiver.version();
        const std::uint64_t count = receiver.layout().size();
        reply(res, 200, json{{"weight_version", v.label}, {"num_parameters", count}});
      };
    }
    if (path == "/get_fingerprints") {
      return [this](const httplib::Request&, httplib::Response& res) {
        json prints = json::object();
        for (const auto& [name, value] : receiver.fingerprints()) {
          prints[name] = fmt::format("{:016x}", value);
        }
        reply(res, 200, json{{"algorithm", "xxh64-chunked-v1"},
                             {"weight_version", receiver.version().label},
                             {"fingerprints", prints}});
      };
    }
    if (path == "/health") {
      return [this](const httplib::Request&, httplib::Response& res) {
        auto h = receiver.health();
        reply(res, h.ready ? 200 : 503,
              json{{"ready", h.ready}, {"state", h.state}, {"reason", h.reason}});
      };
    }
    if (path == "/init_weights_update_group") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        auto init = receiver::parse_group_init(parse_body(req));
        groups.init(init);
        reply(res, 200, json{{"success", true},
                             {"message", fmt::format("joined weight-update group '{}'",
                                                     init.group_name)}});
      };
    }
    if (path == "/update_weights_from_distributed") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        auto report = groups.update(receiver::parse_distributed_update(parse_body(req)));
        json out = report_json(report);
        out["success"] = true;
        out["message"] = "updated by broadcast";
        reply(res, 200, out);
      };
    }
    if (path == "/update_weights_from_ipc") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        auto report = receiver::update_weights_from_ipc(
            receiver, receiver::parse_ipc_update(parse_body(req)));
        json out = report_json(report);
        out["success"] = true;
        out["message"] = "updated from checkpoint-engine";
        reply(res, 200, out);
      };
    }
    if (path == "/destroy_weights_update_group") {
      return [this](const httplib::Request& req, httplib::Response& res) {
        const json body = parse_body(req);
        const std::string name = receiver::parse_group_name(body);
        const std::string how = groups.destroy(name, receiver::parse_destroy_timeout(body));
        reply(res, 200, json{{"success", true},
                             {"teardown", how},
                             {"message", fmt::format("destroyed weight-update group '{}' ({})",
                                                     name, how)}});
      };
    }
    if (path == "/metrics") {
      return [this](const httplib::Request&, httplib::Response& res) {
        res.status = 200;
        res.set_content(receiver.metrics_text(), "text/plain; version=0.0.4");
      };
    }
    if (path == "/ferry/session") {
      return [this](const httplib::Request&, httplib::Response& res) {
        if (!options.session_info) {
          fail(FERRY_STATUS_NOT_FOUND, "this receiver runs no session listener");
        }
        res.status = 200;
        res.set_content(options.session_info(), "application/json");
      };
    }
    fail(FERRY_STATUS_INTERNAL, "route {} has no handler", path);
  }

  void install() {
    for (const Route& route : kRoutes) {
      Handler h = wrap(route, handler_for(route.path));
      if (std::string(route.method) == "GET") {
        server.Get(route.path, h);
      } else {
        server.Post(route.path, h);
      }
    }
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404 && res.body.empty()) {
        reply(res, 404, json{{"success", false}, {"message", "no route " + req.method + " " + req.path}});
      }
    });
    server.set_payload_max_length(16u << 20);
  }
};

ControlServer::ControlServer(receiver::Receiver& receiver, ServerOptions options)
    : impl_(std::make_unique<Impl>(receiver, std::move(options))) {
  impl_->install();
}

ControlServer::~ControlServer() { stop(); }

void ControlServer::start() {
  auto& s = impl_->server;
  if (impl_->options.port == 0) {
    impl_->bound_port = s.bind_to_any_port(impl_->options.host);
  } else {
    impl_->bound_port =
        s.bind_to_port(impl_->options.host, impl_->options.port) ? impl_->options.port : -1;
  }
  if (impl_->bound_port < 0) {
    fail(FERRY_STATUS_IO, "cannot listen on {}:{} (address in use or not local)",
         impl_->options.host, impl_->options.port);
  }
  impl_->thread = std::thread([this] {
    impl_->server.listen_after_bind();
    impl_->listen_returned = true;
  });
  // httplib's stop() is a no-op until the listen loop runs: wait for it, so that a stop() right
  // after start() (a failed initial load) cannot leave the thread listening forever.
  while (!impl_->server.is_running() && !impl_->listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  logger("control")->info("listening on http://{}:{}{}", impl_->options.host, impl_->bound_port,
                          impl_->options.token.empty() ? "" : " (token required for changes)");
}

void ControlServer::stop() {
  if (!impl_) return;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int ControlServer::port() const { return impl_->bound_port; }

}  // namespace ferry::control
