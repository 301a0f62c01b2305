// tests/cuda_ipc/peer_main.cpp: cuda_ipc_peer, the receiver process of the two-process GPU tests.
// The test (the sender) starts it with fork+exec and drives it by one-line commands on stdin; it
// answers one line on stdout ("ok [value]" or "err <message>"). Its memory comes from ferry's
// CUDA weight store (VMM, exported as fds) or from cudaMalloc (legacy cudaIpc handles).
//
//   address                       -> ok <hex address blob>
//   connect <hex>                 -> ok              (connects back to the sender)
//   store <bytes> <chunk_bytes>   -> ok <hex key>    (store region "weights", registered)
//   legacy <bytes> <offset> <len> -> ok <hex key>    (cudaMalloc(bytes), registers [offset,+len))
//   sub <allocation> <offset> <len> -> ok <hex key>  (another range of an earlier cudaMalloc)
//   fill <which> <seed> <offset> <len>  -> ok        (writes pattern(seed) into memory <which>)
//   check <which> <seed> <offset> <len> -> ok | err  (memory <which> holds pattern(seed)?)
//   recv <which> <index> <len>    -> ok | err        (staged: pulls bucket <index> into <which>)
//   drop <which>                  -> ok              (deregisters memory <which>)
//   fds                           -> ok <open fds>
//   quit                          -> exits 0
// <which> is the index of a registration in the order made (0, 1, ...).
#include <cuda_runtime_api.h>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "plugin_client.hpp"
#include "store/cuda_weight_store.hpp"

using namespace ferry::cuda_ipc::test;

namespace {

struct Registered {
  std::uint8_t* base = nullptr;
  std::uint64_t size = 0;
  ferry_memory_t* memory = nullptr;
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) ferry::fail(FERRY_STATUS_INTERNAL, "{}: {}", what, cudaGetErrorName(err));
}

}  // namespace

int main() {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ferry::store::CudaWeightStore> store;
  std::vector<void*> allocations;
  std::vector<Registered> registered;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::string answer = "ok";
    try {
      if (!transport) transport = std::make_unique<Transport>(FERRY_ROLE_RECEIVER, 0);
      if (command == "quit") break;
      if (command == "address") {
        answer += " " + hex(transport->address());
      } else if (command == "connect") {
        std::string blob;
        in >> blob;
        transport->connect(unhex(blob), "sender (test process)");
      } else if (command == "store") {
        std::uint64_t bytes = 0;
        std::uint64_t chunk = 0;
        in >> bytes >> chunk;
        ferry::store::CudaWeightStoreOptions options;
        options.chunk_bytes = chunk;
        store = std::make_unique<ferry::store::CudaWeightStore>(options);
        store->place_all("weights", ferry::store::Policy::Discard,
                         std::vector<ferry::store::TensorSpec>{{"w", FERRY_DTYPE_U8, {bytes}}});
        auto* base = reinterpret_cast<std::uint8_t*>(store->param("w").data);
        ferry_memory_t* m = transport->register_memory(base, bytes, FERRY_MEMORY_CUDA);
        registered.push_back({base, bytes, m});
        answer += " " + hex(transport->pack_key(m));
      } else if (command == "legacy") {
        std::uint64_t bytes = 0;
        std::uint64_t offset = 0;
        std::uint64_t length = 0;
        in >> bytes >> offset >> length;
        void* p = nullptr;
        check(cudaMalloc(&p, bytes), "cudaMalloc");
        allocations.push_back(p);
        auto* base = static_cast<std::uint8_t*>(p) + offset;
        ferry_memory_t* m = transport->register_memory(base, length, FERRY_MEMORY_CUDA);
        registered.push_back({base, length, m});
        answer += " " + hex(transport->pack_key(m));
      } else if (command == "sub") {
        std::size_t allocation = 0;
        std::uint64_t offset = 0;
        std::uint64_t length = 0;
        in >> allocation >> offset >> length;
        auto* base = static_cast<std::uint8_t*>(allocations.at(allocation)) + offset;
        ferry_memory_t* m = transport->register_memory(base, length, FERRY_MEMORY_CUDA);
        registered.push_back({base, length, m});
        answer += " " + hex(transport->pack_key(m));
      } else if (command == "fill" || command == "check") {
        std::size_t which = 0;
        std::uint64_t seed = 0;
        std::uint64_t offset = 0;
        std::uint64_t length = 0;
        in >> which >> seed >> offset >> length;
        const Registered& r = registered.at(which);
        const auto expected = pattern(seed, length);
        if (command == "fill") {
          check(cudaMemcpy(r.base + offset, expected.data(), length, cudaMemcpyHostToDevice),
                "cudaMemcpy fill");
        } else {
          std::vector<std::uint8_t> got(length);
          check(cudaMemcpy(got.data(), r.base + offset, length, cudaMemcpyDeviceToHost),
                "cudaMemcpy check");
          for (std::uint64_t i = 0; i < length; ++i) {
            if (got[i] != expected[i]) {
              answer = "err mismatch at byte " + std::to_string(offset + i);
              break;
            }
          }
        }
      } else if (command == "recv") {
        std::size_t which = 0;
        std::uint32_t index = 0;
        std::uint64_t length = 0;
        in >> which >> index >> length;
        ferry_request_t* r = transport->recv_bucket(registered.at(which).memory, length, index);
        transport->finish(r, "recv_bucket " + std::to_string(index));
      } else if (command == "drop") {
        std::size_t which = 0;
        in >> which;
        Registered& r = registered.at(which);
        transport->deregister(r.memory);
        r.memory = nullptr;
      } else if (command == "fds") {
        answer += " " + std::to_string(open_fds());
      } else {
        answer = "err unknown command '" + command + "'";
      }
    } catch (const std::exception& e) {
      answer = std::string("err ") + e.what();
    }
    std::cout << answer << std::endl;
  }
  transport.reset();
  for (void* p : allocations) (void)cudaFree(p);
  return 0;
}
