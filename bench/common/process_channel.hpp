// bench/common/process_channel.hpp: length-prefixed messages between two processes over one end
// each of a socketpair: how a benchmark (and the UCX tests) carries rendezvous bytes and commands
// between a parent and the child it forked. Header-only; it depends on nothing but the SDK's error
// type.
#pragma once

#include <ferry/sdk/error.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::bench {

// One end of the channel. Does not own `fd` (the caller closes it). One thread per end. Every
// failure throws ferry::Error IO prefixed with `who`: the other process closed its end or died,
// or announced a message over kMaxMessageBytes (a broken stream, not a message).
class ProcessChannel {
 public:
  using Bytes = std::vector<std::uint8_t>;
  static constexpr std::uint64_t kMaxMessageBytes = 1ull << 24;

  // `who` must outlive the channel (a string literal).
  ProcessChannel(int fd, const char* who) : fd_(fd), who_(who) {}

  void send(const Bytes& bytes) const {
    const std::uint64_t n = bytes.size();
    write_all(&n, sizeof n);
    write_all(bytes.data(), bytes.size());
  }
  void send(const std::string& text) const { send(Bytes(text.begin(), text.end())); }

  Bytes receive() const {
    std::uint64_t n = 0;
    read_all(&n, sizeof n);
    if (n > kMaxMessageBytes) fail(FERRY_STATUS_IO, "{}: control message of {} bytes", who_, n);
    Bytes bytes(n);
    read_all(bytes.data(), n);
    return bytes;
  }
  std::string receive_text() const {
    const Bytes b = receive();
    return std::string(b.begin(), b.end());
  }

 private:
  void write_all(const void* p, std::size_t n) const {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(FERRY_STATUS_IO, "{}: the other process went away", who_);
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void read_all(void* p, std::size_t n) const {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = ::read(fd_, c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail(FERRY_STATUS_IO, "{}: the other process went away", who_);
      c += r;
      n -= static_cast<std::size_t>(r);
    }
  }

  int fd_;
  const char* who_;
};

}  // namespace ferry::bench
