// registry/plugin_file.cpp: plugin file naming convention and the file-safety checks done before
// any code from a plugin is mapped.
#include "registry/plugin_file.hpp"

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ferry::registry {
namespace {

constexpr const char* kTransportPrefix = "libferry_transport_";
constexpr const char* kModelPrefix = "libferry_model_";
constexpr const char* kSuffix = ".so";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string octal_mode(mode_t mode) {
  return fmt::format("{:04o}", mode & 07777);
}

// The reason `st` (of `what`, "file" or "folder <dir>") is unsafe, if it is.
std::optional<std::string> unsafe_owner_or_mode(const struct stat& st, const std::string& what) {
  if ((st.st_mode & S_IWOTH) != 0) {
    return fmt::format("world-writable {} (mode {}); anyone could replace the code", what,
                       octal_mode(st.st_mode));
  }
  const uid_t me = geteuid();
  if (st.st_uid != 0 && st.st_uid != me) {
    return fmt::format("{} is owned by uid {}, which is neither root nor the current user (uid {})",
                       what, st.st_uid, me);
  }
  return std::nullopt;
}

}  // namespace

bool looks_like_plugin_file(const std::string& filename) {
  return (starts_with(filename, kTransportPrefix) || starts_with(filename, kModelPrefix)) &&
         ends_with(filename, kSuffix);
}

std::optional<PluginFileName> parse_plugin_file_name(const std::string& filename,
                                                     std::string* why) {
  auto set_why = [&](std::string text) {
    if (why != nullptr) *why = std::move(text);
  };
  if (!looks_like_plugin_file(filename)) {
    set_why(
        fmt::format("file name '{}' does not follow libferry_transport_<name>.so or "
                    "libferry_model_<name>.so",
                    filename));
    return std::nullopt;
  }
  PluginFileName parsed;
  std::string prefix = kTransportPrefix;
  if (starts_with(filename, kModelPrefix)) {
    parsed.kind = FERRY_PLUGIN_MODEL;
    prefix = kModelPrefix;
  }
  parsed.name = filename.substr(prefix.size(), filename.size() - prefix.size() - 3);
  if (parsed.name.empty()) {
    set_why(fmt::format("file name '{}' has an empty plugin name", filename));
    return std::nullopt;
  }
  for (char c : parsed.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) {
      set_why(fmt::format("plugin name '{}' in file name '{}' has characters outside [a-z0-9_-]",
                          parsed.name, filename));
      return std::nullopt;
    }
  }
  return parsed;
}

std::optional<std::string> unsafe_file_reason(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return fmt::format("cannot stat the file: {}", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return std::string("not a regular file");
  if (auto reason = unsafe_owner_or_mode(st, "file")) return reason;

  // The folder it was found in and, when the file is a symlink, the folder of its target: either
  // lets someone else swap the code.
  std::vector<std::filesystem::path> folders{path.parent_path()};
  std::error_code ec;
  const auto real = std::filesystem::canonical(path, ec);
  if (!ec && real.parent_path() != folders.front()) folders.push_back(real.parent_path());
  for (const auto& folder : folders) {
    const auto shown = folder.empty() ? std::filesystem::path(".") : folder;
    struct stat dst {};
    if (::stat(shown.c_str(), &dst) != 0) {
      return fmt::format("cannot stat folder {}: {}", shown.string(), std::strerror(errno));
    }
    if (auto reason = unsafe_owner_or_mode(dst, "folder " + shown.string())) return reason;
  }
  return std::nullopt;
}

}  // namespace ferry::registry
