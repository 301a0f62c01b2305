// Finding a receiver: address, discovery, session channel, transport (see
// session/sender/discovery.hpp).
#include "session/sender/discovery.hpp"

#include <ferry/sdk/error.hpp>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "config/config.hpp"
#include "session/served_ports.hpp"

namespace ferry::session {
namespace {

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

}  // namespace

HostPort parse_address(const std::string& address) {
  HostPort hp;
  std::string port_text;
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' is not [HOST]:PORT", address);
    }
    hp.host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' is not HOST:PORT", address);
    }
    hp.host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  try {
    std::size_t used = 0;
    hp.port = std::stoi(port_text, &used);
    if (used != port_text.size() || hp.port <= 0 || hp.port > 65535) throw std::out_of_range("");
  } catch (const std::exception&) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "receiver address '{}' has no valid port", address);
  }
  return hp;
}

std::unique_ptr<Channel> open_channel(const std::string& address, const SenderOptions& options) {
  const HostPort hp = parse_address(address);
  const std::string who = "receiver " + address;
  httplib::Client client(hp.host, hp.port);
  const auto ms = options.connect_timeout.count();
  client.set_connection_timeout(std::chrono::milliseconds(ms));
  client.set_read_timeout(std::chrono::milliseconds(ms));
  client.set_write_timeout(std::chrono::milliseconds(ms));
  httplib::Headers headers;
  if (!options.token.empty()) headers.emplace("Authorization", "Bearer " + options.token);
  auto res = client.Get("/ferry/session", headers);
  if (!res) {
    fail(FERRY_STATUS_PEER_FAILED, "{}: discovery: GET /ferry/session failed ({})", who,
         httplib::to_string(res.error()));
  }
  if (res->status != 200) {
    fail(FERRY_STATUS_PEER_FAILED, "{}: discovery: GET /ferry/session answered {}: {}", who,
         res->status, res->body.substr(0, 300));
  }
  auto info = nlohmann::json::parse(res->body, nullptr, false);
  if (info.is_discarded() || !info.is_object() || !info.contains("port") ||
      !info["port"].is_number_integer()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: discovery: GET /ferry/session gave no session port",
         who);
  }
  const int port = info["port"].get<int>();
  const std::string unix_path = info.contains("unix_path") && info["unix_path"].is_string()
                                    ? info["unix_path"].get<std::string>()
                                    : "";
  const auto deadline = deadline_in(options.connect_timeout);
  if (!unix_path.empty() && is_loopback(hp.host) && std::filesystem::exists(unix_path)) {
    try {
      return std::make_unique<Channel>(connect_unix(unix_path, deadline, who), who);
    } catch (const Error& e) {
      logger("sender")->debug("{}: Unix socket failed ({}); using TCP", who, e.what());
    }
  }
  return std::make_unique<Channel>(connect_tcp(hp.host, port, deadline, who + " session"), who);
}

TransportChoice transport_for(const std::string& address, bool cuda_tensors,
                              const SenderOptions& options, const config::Config& config,
                              const registry::Registry& registry) {
  TransportQuery q;
  q.requested = options.transport.empty() ? config.update.transport : options.transport;
  q.preference = config.update.transport_preference;
  q.receiver = address;
  const HostPort where = parse_address(address);
  q.receiver_on_this_host = is_this_host(where.host);
  q.receiver_in_this_process = q.receiver_on_this_host && served_in_this_process(where.port);
  q.cuda_tensors = cuda_tensors;
  auto choice = choose_transport(
      q, [&](const std::string& name) { return transport_facts(registry, name); });
  logger("sender")->info("receiver {}: transport {}", address, choice.why);
  return choice;
}

}  // namespace ferry::session
