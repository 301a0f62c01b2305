// The control ports served by receiver endpoints of this process (see session/served_ports.hpp).
#include "session/served_ports.hpp"

#include <mutex>
#include <set>

namespace ferry::session {
namespace {

std::mutex& ports_mutex() {
  static std::mutex m;
  return m;
}
std::multiset<int>& ports() {
  static std::multiset<int> served;
  return served;
}

}  // namespace

void note_served_port(int port) {
  std::lock_guard lock(ports_mutex());
  ports().insert(port);
}

void forget_served_port(int port) {
  std::lock_guard lock(ports_mutex());
  if (auto it = ports().find(port); it != ports().end()) ports().erase(it);
}

bool served_in_this_process(int port) {
  std::lock_guard lock(ports_mutex());
  return ports().count(port) > 0;
}

}  // namespace ferry::session
