// The bearer token of the `ferry` commands: option, file or environment (see
// cli/token_option.hpp).
#include "cli/token_option.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ferry/sdk/error.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"

namespace ferry::cli {
namespace {

constexpr std::size_t kMaxTokenFileBytes = 4096;

}  // namespace

std::shared_ptr<TokenOptions> add_token_options(CLI::App& cmd, const std::string& what) {
  auto o = std::make_shared<TokenOptions>();
  auto* token = cmd.add_option("--token", o->token,
                               what + " (visible in ps: prefer --token-file or FERRY_TOKEN)");
  auto* file = cmd.add_option("--token-file", o->token_file,
                              "file holding the token (" + what +
                                  "); only its owner may read it");
  token->excludes(file);
  return o;
}

std::string read_token_file(const std::string& path) {
  // O_NONBLOCK: a FIFO given by mistake is refused below instead of blocking the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "token file '{}': cannot open: {}", path,
         std::strerror(errno));
  }
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  std::string text;
  if (stat_ok && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) <= kMaxTokenFileBytes) {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "token file '{}' is not a regular file", path);
  }
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "token file '{}' can be read or written by every user (mode {:o}); chmod 600 it", path,
         st.st_mode & 0777);
  }
  if ((st.st_mode & (S_IRGRP | S_IWGRP)) != 0) {
    logger("cli")->warn("token file '{}' can be read or written by its group (mode {:o})", path,
                        st.st_mode & 0777);
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxTokenFileBytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "token file '{}' is {} bytes, more than a token ({} at most)",
         path, st.st_size, kMaxTokenFileBytes);
  }
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  std::size_t begin = 0, end = text.size();
  while (begin < end && blank(text[begin])) ++begin;
  while (end > begin && blank(text[end - 1])) --end;
  const std::string token = text.substr(begin, end - begin);
  if (token.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "token file '{}' is empty", path);
  for (unsigned char c : token) {
    if (c < 0x20 || c == 0x7f) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "token file '{}' holds a line break or control character inside the token (one line "
           "expected)",
           path);
    }
  }
  return token;
}

std::optional<std::string> resolve_token(const TokenOptions& options) {
  if (options.token) return options.token;
  if (options.token_file) return read_token_file(*options.token_file);
  const char* env = std::getenv(kTokenEnvironment);
  if (env != nullptr && env[0] != '\0') return std::string(env);
  return std::nullopt;
}

}  // namespace ferry::cli
