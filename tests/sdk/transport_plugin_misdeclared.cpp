// tests/sdk/transport_plugin_misdeclared.cpp: transport declarations the table template must
// refuse at compile time, one per FERRY_CASE (misdeclared_test.sh compiles each and expects the
// static_assert message in its comment). FERRY_CASE 0 is the well-formed baseline.
#include <ferry/sdk/transport_plugin.hpp>

#include <memory>
#include <vector>

namespace sdk = ferry::sdk;

struct Base {
  std::vector<std::uint8_t> address() { return {}; }
  ferry_peer* connect(const ferry_connect_args_t&) { return nullptr; }
  void disconnect(ferry_peer*) noexcept {}
  ferry_request* send_bucket(ferry_peer*, const ferry_bucket_io_t&) { return nullptr; }
  ferry_request* recv_bucket(ferry_peer*, const ferry_bucket_io_t&) { return nullptr; }
  ferry_memory* register_memory(const ferry_memory_desc_t&) { return nullptr; }
  void deregister_memory(ferry_memory*) noexcept {}
};

struct Transport : Base {
#if FERRY_CASE == 1  // "with kDirectWrite, and only then": put and pack_key but no flush
  std::vector<std::uint8_t> pack_key(ferry_memory*) { return {}; }
  ferry_request* put(ferry_peer*, const ferry_put_args_t&) { return nullptr; }
#endif
#if FERRY_CASE == 2  // "with kAbort, and only then": abort without declaring kAbort
  void abort(const char*) noexcept {}
#endif
};

struct Family {
  using Transport = ::Transport;
  static constexpr const char* kName = "misdeclared";
  static constexpr const char* kVersion = "0";
  static constexpr const char* const* kOptions = sdk::kNoOptions;
#if FERRY_CASE == 1
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory | sdk::kDirectWrite;
#elif FERRY_CASE == 4  // "kPutFingerprint needs kDirectWrite"
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory | sdk::kPutFingerprint;
#elif FERRY_CASE == 5  // "with kMemory, and only then": the memory methods, kMemory left out
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint;
#else
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory;
#endif
#if FERRY_CASE == 3  // "kConstraints may hold only": a function group's bit claimed directly
  static constexpr std::uint32_t kConstraints = FERRY_TRANSPORT_CAP_DIRECT_WRITE;
#endif
  static sdk::TransportCaps caps() { return {.memory_kinds = FERRY_MEMORY_HOST}; }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t&) {
    return std::make_unique<Transport>();
  }
};

const ferry_transport_api_t* table() { return sdk::TransportPlugin<Family>::api(); }
