// Which data transport a sender uses for one receiver (see session/transport_choice.hpp).
#include "session/transport_choice.hpp"

#include <arpa/inet.h>
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include "registry/registry.hpp"

namespace ferry::session {

TransportFacts transport_facts(const registry::Registry& registry, const std::string& name) {
  TransportFacts f;
  try {
    auto plugin = registry.transport(name);
    f.loadable = true;
    if (const auto& caps = plugin->info().transport_caps) {
      f.flags = caps->flags;
      f.memory_kinds = caps->memory_kinds;
    }
  } catch (const Error& e) {
    f.error = e.what();
  }
  return f;
}

std::string transport_misfit(const TransportQuery& query, const TransportFacts& facts) {
  if ((facts.flags & FERRY_TRANSPORT_CAP_POINT_TO_POINT) == 0) {
    return "not a point-to-point transport";
  }
  if ((facts.flags & FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) != 0 && !query.receiver_on_this_host) {
    return "works only between processes of one host, and the receiver is not on this host";
  }
  if ((facts.flags & FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES) != 0 &&
      query.receiver_in_this_process) {
    return "needs two processes, and the receiver is in this process";
  }
  const bool device_only = (facts.memory_kinds & FERRY_MEMORY_CUDA) != 0 &&
                           (facts.memory_kinds & FERRY_MEMORY_HOST) == 0;
  if (device_only && !query.cuda_tensors) {
    return "moves CUDA memory, and the tensors are not all on a GPU";
  }
  return {};
}

TransportChoice choose_transport(const TransportQuery& query,
                                 const std::function<TransportFacts(const std::string&)>& facts) {
  if (query.requested == "inline") return {"inline", true, "inline (asked for)"};
  if (query.requested != "auto") {
    const TransportFacts f = facts(query.requested);
    if (f.loadable && (f.flags & FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) != 0 &&
        !query.receiver_on_this_host) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "receiver {}: transport '{}' works only between processes of one host, and this "
           "receiver is not on this host (use 'auto' or a network transport for a remote "
           "receiver)",
           query.receiver, query.requested);
    }
    if (f.loadable && (f.flags & FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES) != 0 &&
        query.receiver_in_this_process) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "receiver {}: transport '{}' cannot reach a receiver in this same process (its peers "
           "must be two processes); use 'auto'",
           query.receiver, query.requested);
    }
    // Not loadable: the data path reports why when it is created (the transport is required).
    return {query.requested, true, query.requested + " (asked for)"};
  }
  // What was passed over and why, for the log line: "; not X: reason" per plugin.
  std::string skipped;
  for (const auto& name : query.preference) {
    const TransportFacts f = facts(name);
    const std::string misfit =
        f.loadable ? transport_misfit(query, f) : "not loadable: " + f.error;
    if (misfit.empty()) return {name, false, name + " (preferred, and it fits)" + skipped};
    skipped += "; not " + name + ": " + misfit;
  }
  return {"inline", false, "inline (no preferred transport fits" + skipped + ")"};
}

bool is_this_host(const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = ::inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return false;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      found = in->sin_addr.s_addr == v4.s_addr;
    } else if (is_v6 && a->ifa_addr->sa_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      found = std::memcmp(&in->sin6_addr, &v6, sizeof v6) == 0;
    }
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace ferry::session
