// tests/ckpt_engine/fake_parameter_server.hpp: the ParameterServer side of the checkpoint-engine
// protocol for tests: a real ZMQ REQ socket bound to an abstract ipc:// address, sending pickled
// messages (fixtures or PickleBytes) and reading the worker's answers; plus the host-memory
// stand-in for the one step that needs a GPU (opening the CUDA IPC handle).
#pragma once

#include <ferry/sdk/error.hpp>

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "ckpt_engine/zmq_worker.hpp"
#include "pickle_bytes.hpp"

namespace ferry::ckpt_engine::testing {

inline std::vector<std::uint8_t> fixture(const std::string& name) {
  std::ifstream in(std::filesystem::path(FERRY_CKPT_FIXTURE_DIR) / (name + ".pickle"),
                   std::ios::binary);
  if (!in) throw std::runtime_error("missing fixture " + name);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// reduce_tensor() of a uint8 CUDA buffer of `bytes` bytes, as torch 2.x pickles it (the layout of
// fixtures/ipc_handle.pickle), with handle bytes 0..63.
inline std::vector<std::uint8_t> ipc_handle_message(std::uint64_t bytes) {
  std::string handle = "\x02" "c";
  for (int i = 0; i < 64; ++i) handle += static_cast<char>(i);
  PickleBytes p;
  p.global("torch.multiprocessing.reductions", "rebuild_cuda_tensor").mark();
  p.global("torch", "Tensor").size({static_cast<std::int64_t>(bytes)}).integer(1).op(0x85).integer(0);
  p.global("torch.storage", "TypedStorage").global("torch", "uint8").integer(0);
  p.bin(handle).integer(static_cast<std::int64_t>(bytes)).integer(0).op(0x89).bin("/torch_1_2_3");
  p.integer(0).bin(std::string(64, 'e')).op(0x89).tuple().op(0x86).stop();
  return p.bytes();
}

struct TensorMeta {
  std::string name;
  std::string dtype;  // torch name: "bfloat16", "float32", ...
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
};

// _to_named_tensor(...): a list of {name, dtype, shape, offset} dicts.
inline std::vector<std::uint8_t> bucket_message(const std::vector<TensorMeta>& tensors) {
  PickleBytes p;
  p.op(']').mark();
  for (const auto& t : tensors) p.tensor_meta(t.name, t.dtype, t.shape, t.offset);
  p.op('e').stop();
  return p.bytes();
}

inline std::vector<std::uint8_t> none_message() { return PickleBytes().none().stop().bytes(); }

// Unique abstract socket addresses, as checkpoint-engine makes them per update.
inline std::string test_address() {
  static std::atomic<int> counter{0};
  return "ipc://@ferry-ckpt-test-" + std::to_string(getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + ".sock";
}

class FakeParameterServer {
 public:
  FakeParameterServer() : address_(test_address()) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(address_);
  }
  const std::string& address() const { return address_; }

  void send(const std::vector<std::uint8_t>& bytes) {
    socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  }
  // The worker's answer, or nullopt when none came within `timeout`.
  std::optional<std::string> answer(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
    zmq::message_t m;
    if (!socket_.recv(m)) return std::nullopt;
    return m.to_string();
  }
  // Simulates the ParameterServer process going away: its socket closes.
  void close() { socket_.close(); }

 private:
  std::string address_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::req};
};

// Host memory in place of the CUDA IPC mapping: the test writes buckets into `buffer`.
class HostBufferOpener final : public SharedBufferOpener {
 public:
  explicit HostBufferOpener(std::vector<std::byte>& buffer) : buffer_(buffer) {}
  const std::byte* open(const IpcBufferHandle& handle) override {
    if (handle.buffer_bytes() > buffer_.size()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "test buffer smaller than the handle's {} bytes",
           handle.buffer_bytes());
    }
    ++opened;
    return buffer_.data();
  }
  void close() noexcept override { ++closed; }
  void copy_out(void* dst, const std::byte* src, std::uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  int opened = 0;
  int closed = 0;

 private:
  std::vector<std::byte>& buffer_;
};

}  // namespace ferry::ckpt_engine::testing
