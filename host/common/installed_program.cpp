// common/installed_program.cpp: finding ferry's programs from the tree the calling code was
// loaded from (see installed_program.hpp).
#include "common/installed_program.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "common/ferry_install_paths.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

bool executable(const fs::path& p) {
  std::error_code ec;
  return ::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p, ec);
}

// `dir` with its trailing components `tail` ("lib/x86_64-linux-gnu") removed, if it ends so.
std::optional<fs::path> strip_tail(const fs::path& dir, const fs::path& tail) {
  fs::path rest = dir.lexically_normal();
  if (rest.filename().empty()) rest = rest.parent_path();
  std::vector<fs::path> parts(tail.begin(), tail.end());
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (it->empty()) continue;
    if (rest.filename() != *it) return std::nullopt;
    rest = rest.parent_path();
  }
  return rest;
}

}  // namespace

fs::path own_object() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&own_object), &info) == 0 ||
      info.dli_fname == nullptr || *info.dli_fname == '\0') {
    std::error_code ec;
    return fs::read_symlink("/proc/self/exe", ec);
  }
  std::error_code ec;
  auto real = fs::canonical(info.dli_fname, ec);
  return ec ? fs::path(info.dli_fname) : real;
}

std::vector<fs::path> program_candidates(const InstalledProgram& program) {
  std::vector<fs::path> candidates;
  auto add = [&](const fs::path& c) {
    if (std::find(candidates.begin(), candidates.end(), c) == candidates.end()) {
      candidates.push_back(c);
    }
  };
  const fs::path object = own_object();
  const fs::path dir = object.parent_path();
  const fs::path libexec_ferry = fs::path(FERRY_LIBEXECDIR) / "ferry";
  for (const fs::path& tail : {fs::path(FERRY_BINDIR), fs::path(FERRY_LIBDIR), fs::path("bin"),
                               fs::path("lib"), libexec_ferry, fs::path("libexec/ferry")}) {
    if (auto prefix = strip_tail(dir, tail)) add(*prefix / program.relative);
  }
  const std::string build_root = FERRY_BUILD_ROOT;
  if (object.string().rfind(build_root + "/", 0) == 0) add(program.in_build);
  add(fs::path(FERRY_PREFIX) / program.relative);
  return candidates;
}

std::optional<fs::path> find_program(const InstalledProgram& program) {
  for (const auto& c : program_candidates(program)) {
    if (executable(c)) return c;
  }
  return std::nullopt;
}

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (std::size_t start = 0; start < raw.size();) {
    const std::size_t end = raw.find('\0', start);
    args.push_back(raw.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return args;
}

std::string candidates_text(const std::vector<fs::path>& candidates) {
  std::string text;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i > 0) text += i + 1 == candidates.size() ? " or " : ", ";
    text += candidates[i].string();
  }
  return text;
}

}  // namespace ferry
