// tests/capi/fuzz_session.cpp: libFuzzer target over the receiver's side of the session
// protocol (docs/session-protocol.md). One in-process receiver (the C API, two host parameters,
// inline data path) serves for the whole run; each input is sent on a new TCP session
// connection, optionally after a valid Hello for that receiver (the first byte's bit 0; bit 1
// asks to keep the session), then the sender's half is closed. Whatever the bytes, the receiver
// must answer or close the connection without crashing, hanging or corrupting memory (ASan), and
// an update it cannot complete must not be published.
#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <ferry/ferry.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "session.capnp.h"

namespace {

float g_a[64];
std::uint16_t g_b[8 * 16];
int g_session_port = 0;
ferry_receiver_t* g_receiver = nullptr;  // serves until the process ends (reachable: no leak)

void die(const char* what) {
  std::fprintf(stderr, "fuzz_session: %s\n", what);
  std::abort();
}

void check(ferry_error_t* error, const char* what) {
  if (error != nullptr) {
    std::fprintf(stderr, "fuzz_session: %s: %s\n", what, ferry_error_message(error));
    std::abort();
  }
}

void add_param(ferry_receiver_t* rx, const char* name, ferry_dtype_t dtype,
               std::vector<std::int64_t> shape, void* data) {
  static std::vector<std::vector<std::int64_t>> shapes;  // live as long as the receiver
  shapes.push_back(std::move(shape));
  ferry_tensor_t t{};
  t.struct_size = sizeof t;
  t.name = name;
  t.dtype = dtype;
  t.ndim = static_cast<std::uint32_t>(shapes.back().size());
  t.shape = shapes.back().data();
  t.data = data;
  t.memory_kind = FERRY_MEMORY_HOST;
  check(ferry_receiver_register_param(rx, &t), "register_param");
}

// A frame: the 16-byte header ("FRY1", kind 1 = message, length) and a flat Cap'n Proto message.
std::vector<std::uint8_t> hello_frame(bool keep) {
  capnp::MallocMessageBuilder m;
  auto hello = m.initRoot<ferry::session::wire::Message>().initHello();
  hello.setProtocolVersion(ferry::session::wire::PROTOCOL_VERSION);
  hello.setSenderName("fuzz");
  auto tensors = hello.initTensors(2);
  tensors[0].setName("a");
  tensors[0].setDtype(FERRY_DTYPE_F32);
  tensors[0].initShape(1).set(0, 64);
  tensors[1].setName("b");
  tensors[1].setDtype(FERRY_DTYPE_BF16);
  auto shape = tensors[1].initShape(2);
  shape.set(0, 8);
  shape.set(1, 16);
  hello.setTransport("inline");
  hello.setTransportRequired(true);
  hello.setBucketBytes(4096);
  hello.setSlots(2);
  hello.setKeepSession(keep);
  const auto words = capnp::messageToFlatArray(m);
  const auto bytes = words.asBytes();
  std::vector<std::uint8_t> frame(16);
  const std::uint32_t magic = 0x31595246, kind = 1;
  const std::uint64_t length = bytes.size();
  std::memcpy(frame.data(), &magic, 4);
  std::memcpy(frame.data() + 4, &kind, 4);
  std::memcpy(frame.data() + 8, &length, 8);
  frame.insert(frame.end(), bytes.begin(), bytes.end());
  return frame;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  check(ferry_receiver_create(nullptr, &g_receiver), "receiver_create");
  ferry_receiver_t* rx = g_receiver;
  add_param(rx, "a", FERRY_DTYPE_F32, {64}, g_a);
  add_param(rx, "b", FERRY_DTYPE_BF16, {8, 16}, g_b);
  std::int32_t port = 0;
  check(ferry_receiver_serve(rx, "127.0.0.1", 0, &port), "receiver_serve");
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/ferry/session");
  if (!res || res->status != 200) die("GET /ferry/session failed");
  g_session_port = nlohmann::json::parse(res->body).at("port").get<int>();
  return 0;  // the receiver serves until the process ends
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::uint8_t> bytes;
  if (data[0] & 1) bytes = hello_frame((data[0] & 2) != 0);
  bytes.insert(bytes.end(), data + 1, data + size);

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(g_session_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
  // The receiver may refuse and close before reading everything: a failed send ends the input.
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // Whatever it got, the receiver must end the session (answer, then close) promptly: the
  // sender's half is closed, so there is nothing left to wait for.
  char sink[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 8000);
    if (ready < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    if (ready == 0) die("the receiver kept a session open 8 s after its sender closed its half");
    if (ready < 0) die("poll");
    const ssize_t n = ::recv(fd, sink, sizeof sink, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  ::close(fd);
  return 0;
}
