// Checks of client-named paths and text before the receiver acts on them (see
// receiver/client_input.hpp).
#include "receiver/client_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ferry/sdk/error.hpp>

#include <cerrno>
#include <cstring>

namespace ferry::receiver {
namespace {

// What a file that is neither a regular file nor a folder is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a folder";
  return "not a regular file";
}

// Closes a descriptor on every path out.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void refuse_nul(std::string_view value, std::string_view field) {
  const auto at = value.find('\0');
  if (at == std::string_view::npos) return;
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "{} holds a NUL byte at offset {} (after '{}'); a path or address cannot contain one",
       field, at, value.substr(0, at));
}

void check_checkpoint_path(const std::filesystem::path& path, std::string_view field) {
  refuse_nul(path.native(), field);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // absent or unreadable: the open names it
  if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return;
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "{} '{}' is {}, not a safetensors file, index or checkpoint folder", field, path.string(),
       kind_of(st.st_mode));
}

std::string read_optional_text_file(const std::filesystem::path& file, std::uint64_t limit) {
  // O_NONBLOCK: an open of a FIFO returns at once instead of waiting for a writer.
  Descriptor d{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (d.fd < 0) {
    if (errno == ENOENT) return {};
    fail(FERRY_STATUS_IO, "{}: cannot open: {}", file.string(), std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(d.fd, &st) != 0) {
    fail(FERRY_STATUS_IO, "{}: cannot stat: {}", file.string(), std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} is {}, not a regular file", file.string(),
         kind_of(st.st_mode));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > limit) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{} is {} bytes, more than the limit of {}",
         file.string(), size, limit);
  }
  std::string text(size, '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(d.fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fail(FERRY_STATUS_IO, "{}: read failed: {}", file.string(),
           std::strerror(errno));
    }
    if (n == 0) break;  // shrank since the stat: what is there is the text
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace ferry::receiver
