// Which data transport a sender uses for one receiver (see session/transport_choice.hpp).
#include "session/transport_choice.hpp"

#include <arpa/inet.h>
#include <ferry/plugin.h>
#include <ferry/sdk/error.hpp>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

namespace ferry::session {

TransportChoice choose_transport(const TransportQuery& query,
                                 const std::function<TransportFacts(const std::string&)>& facts) {
  if (query.requested == "inline") return {"inline", true, "inline (asked for)"};
  if (query.requested != "auto") {
    const TransportFacts f = facts(query.requested);
    if (f.loadable && (f.flags & FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) != 0 &&
        !query.receiver_on_this_host) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "receiver {}: transport '{}' works only between processes of one host, and this "
           "receiver is not on this host (use ucx or inline for a remote receiver)",
           query.receiver, query.requested);
    }
    if (query.requested == "cuda_ipc" && query.receiver_in_this_process) {
      fail(FERRY_STATUS_INCOMPATIBLE,
           "receiver {}: transport 'cuda_ipc' cannot reach a receiver in this same process (a "
           "process cannot open the CUDA IPC handles it made); use 'auto'",
           query.receiver);
    }
    // Not loadable: the data path reports why when it is created (the transport is required).
    return {query.requested, true, query.requested + " (asked for)"};
  }
  std::string skipped;
  if (query.cuda_tensors && query.receiver_on_this_host && query.receiver_in_this_process) {
    skipped = "; not cuda_ipc: the receiver is in this process, which cannot open its own CUDA "
              "IPC handles";
  } else if (query.cuda_tensors && query.receiver_on_this_host) {
    const TransportFacts f = facts("cuda_ipc");
    if (f.loadable) {
      return {"cuda_ipc", false, "cuda_ipc (CUDA tensors, receiver on this host)"};
    }
    skipped = "; cuda_ipc not loadable: " + f.error;
  }
  const TransportFacts ucx = facts("ucx");
  if (ucx.loadable) return {"ucx", false, "ucx (loadable)" + skipped};
  return {"inline", false, "inline (ucx not loadable: " + ucx.error + ")" + skipped};
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
