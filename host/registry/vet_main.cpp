// registry/vet_main.cpp: ferry-plugin-vet PLUGIN.so, the helper the registry spawns to load a
// plugin in a child process (vetting.hpp). It runs the registry's own load (map, negotiate, check,
// get_caps), writing "stage <step>" before each step that runs plugin code and then "ok" or
// "refused <reason>" on fd 3. A crash or hang shows in how the process ends; the host reads both.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "registry/loader.hpp"
#include "registry/plugin_file.hpp"
#include "registry/vetting.hpp"

namespace {

void report(std::string line) {
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';  // one line each
  }
  const std::string text = line + "\n";
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(ferry::registry::kReportFd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: ferry-plugin-vet PLUGIN.so (run by the ferry host; reports on fd 3)\n");
    return 2;
  }
  const std::filesystem::path path = argv[1];
  std::string why;
  auto expected = ferry::registry::parse_plugin_file_name(path.filename().string(), &why);
  if (!expected) {
    report(ferry::registry::kRefusedPrefix + why);
    return 0;
  }
  auto plugin = ferry::registry::load_vetted(path, *expected, &why, [](const char* step) {
    report(std::string(ferry::registry::kStagePrefix) + step);
  });
  report(plugin ? std::string(ferry::registry::kAcceptedLine)
                : ferry::registry::kRefusedPrefix + why);
  // The plugin stays mapped: its destructors do not run (a crash there is not the host's).
  std::fflush(nullptr);
  ::_exit(0);
}
