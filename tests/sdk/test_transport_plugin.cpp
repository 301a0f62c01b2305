// Tests of the SDK's transport table template (ferry/sdk/transport_plugin.hpp): the capability
// bits and table entries follow the declared groups exactly, and an exception in a method
// becomes an error object with the right code and message.
#include <gtest/gtest.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

// The handles of the test transports.
struct ferry_peer {
  int id = 0;
};
struct ferry_memory {
  std::uint64_t size = 0;
};
struct ferry_source {
  std::vector<std::uint8_t> catalog() { return {1, 2, 3}; }
  ferry::sdk::SourceBucket read(const ferry_source_read_args_t& args) {
    if (args.dst_capacity == 0) ferry::fail(FERRY_STATUS_END_OF_STREAM, "test: no more buckets");
    return {{9}, args.dst_capacity};
  }
};

namespace {

namespace sdk = ferry::sdk;

// A host whose errors are plain heap objects, so a test can read them.
struct TestError {
  ferry_status_code_t code;
  std::string message;
};
ferry_error_t* error_new(ferry_status_code_t code, const char* message) {
  return reinterpret_cast<ferry_error_t*>(new TestError{code, message});
}
void error_free(ferry_error_t* e) {
  delete reinterpret_cast<TestError*>(e);
}
ferry_status_code_t error_code(const ferry_error_t* e) {
  return reinterpret_cast<const TestError*>(e)->code;
}
const char* error_message(const ferry_error_t* e) {
  return reinterpret_cast<const TestError*>(e)->message.c_str();
}
void log(ferry_log_level_t, const char*, const char*) {}
const ferry_host_api_t kHost = {FERRY_STRUCT_SIZE(ferry_host_api_t, log),
                                FERRY_PLUGIN_ABI_MAJOR,
                                FERRY_PLUGIN_ABI_MINOR,
                                error_new,
                                error_free,
                                error_code,
                                error_message,
                                log};

// An error's code and message, freed; OK and "" for none.
struct Outcome {
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
};
Outcome take(ferry_error_t* error) {
  if (error == nullptr) return {};
  Outcome o{error_code(error), error_message(error)};
  error_free(error);
  return o;
}

class TransportPluginTest : public ::testing::Test {
 protected:
  void SetUp() override { sdk::set_host_api(&kHost); }
};

// What a test transport's methods do: succeed, or throw one kind of exception.
enum class Throw { kNothing, kFerryError, kBadAlloc, kStdException, kInt };
Throw g_throw = Throw::kNothing;
void maybe_throw() {
  switch (g_throw) {
    case Throw::kNothing:
      return;
    case Throw::kFerryError:
      ferry::fail(FERRY_STATUS_TIMEOUT, "peer 'r1' passed bucket {}", 3);
    case Throw::kBadAlloc:
      throw std::bad_alloc();
    case Throw::kStdException:
      throw std::runtime_error("a bug in the transport");
    case Throw::kInt:
      throw 42;
  }
}

// Point-to-point with registered memory and abort; no direct write, no requests, no source.
struct PeersOnly {
  int aborts = 0;
  std::vector<std::uint8_t> address() { return {'h', 'i'}; }
  ferry_peer* connect(const ferry_connect_args_t& args) {
    maybe_throw();
    return new ferry_peer{static_cast<int>(args.local_rank)};
  }
  void disconnect(ferry_peer* peer) noexcept { delete peer; }
  ferry_request* send_bucket(ferry_peer*, const ferry_bucket_io_t&) {
    maybe_throw();
    return nullptr;
  }
  ferry_request* recv_bucket(ferry_peer*, const ferry_bucket_io_t&) { return nullptr; }
  ferry_memory* register_memory(const ferry_memory_desc_t& desc) {
    return new ferry_memory{desc.size};
  }
  void deregister_memory(ferry_memory* memory) noexcept { delete memory; }
  void abort(const char*) noexcept { ++aborts; }
};

struct PeersOnlyPlugin {
  using Transport = PeersOnly;
  static constexpr const char* kName = "peers";
  static constexpr const char* kVersion = "0";
  static constexpr const char* const* kOptions = sdk::kNoOptions;
  static constexpr std::uint32_t kGroups = sdk::kPointToPoint | sdk::kMemory | sdk::kAbort;
  static constexpr std::uint32_t kConstraints = FERRY_TRANSPORT_CAP_SAME_NODE_ONLY;
  static sdk::TransportCaps caps() {
    return {.memory_kinds = FERRY_MEMORY_HOST,
            .preferred_bucket_bytes = 1 << 20,
            .max_inflight_buckets = 2};
  }
  static int creates;
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t& args) {
    ++creates;
    maybe_throw();
    if (args.num_options > 0) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "peers: unknown option '{}'", args.options[0].key);
    }
    return std::make_unique<Transport>();
  }
};
int PeersOnlyPlugin::creates = 0;

// A source, no peers, no constraints (kConstraints left out).
struct SourceOnly {
  std::unique_ptr<ferry_source> source_open(const char*) {
    return std::make_unique<ferry_source>();
  }
};
struct SourceOnlyPlugin {
  using Transport = SourceOnly;
  static constexpr const char* kName = "src";
  static constexpr const char* kVersion = "0";
  static constexpr const char* const* kOptions = nullptr;
  static constexpr std::uint32_t kGroups = sdk::kSource;
  static sdk::TransportCaps caps() { return {.memory_kinds = FERRY_MEMORY_HOST}; }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t&) {
    return std::make_unique<Transport>();
  }
};

// Every group.
struct Everything : PeersOnly {
  std::vector<std::uint8_t> pack_key(ferry_memory*) { return {7}; }
  ferry_request* put(ferry_peer*, const ferry_put_args_t&) { return nullptr; }
  ferry_request* flush(ferry_peer*, std::int64_t) { return nullptr; }
  void put_many(ferry_peer*, std::span<const ferry_put_args_t> puts) {
    last_put_many = puts.size();
  }
  const void* map_peer_memory(ferry_peer*, const ferry_blob_t& key, std::uint64_t offset,
                              std::uint64_t, std::int64_t) {
    return static_cast<const std::uint8_t*>(key.data) + offset;
  }
  void prepare_puts(ferry_peer*, std::span<const ferry_blob_t> keys, std::int64_t) {
    last_prepared = keys.size();
  }
  bool request_test(ferry_request*) { return true; }
  void request_wait(ferry_request*, std::int64_t) { maybe_throw(); }
  void request_free(ferry_request*) noexcept {}
  std::unique_ptr<ferry_source> source_open(const char*) {
    return std::make_unique<ferry_source>();
  }
  // kAllocMemory: its own memory (the registration's size field carries it), freed by
  // deregister_memory.
  sdk::Allocation alloc_memory(const ferry_memory_desc_t& desc) {
    allocated.resize(desc.size);
    return {allocated.data(), new ferry_memory{desc.size}};
  }
  std::size_t last_put_many = 0;
  std::size_t last_prepared = 0;
  std::vector<std::uint8_t> allocated;
};
struct EverythingPlugin {
  using Transport = Everything;
  static constexpr const char* kName = "all";
  static constexpr const char* kVersion = "0";
  static constexpr const char* const* kOptions = sdk::kNoOptions;
  static constexpr std::uint32_t kGroups = sdk::kAllTransportGroups;
  static constexpr std::uint32_t kConstraints = sdk::kConstraintFlags;
  static sdk::TransportCaps caps() { return {.memory_kinds = FERRY_MEMORY_CUDA}; }
  static std::unique_ptr<Transport> create(const ferry_transport_create_args_t&) {
    return std::make_unique<Transport>();
  }
};

using PeersTable = sdk::TransportPlugin<PeersOnlyPlugin>;
using SourceTable = sdk::TransportPlugin<SourceOnlyPlugin>;
using EverythingTable = sdk::TransportPlugin<EverythingPlugin>;

// The flags are a function of the declaration, checked where the declaration is.
static_assert(PeersTable::kFlags ==
              (FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY));
static_assert(SourceTable::kFlags == FERRY_TRANSPORT_CAP_SOURCE);
constexpr std::uint32_t kEveryFlag =
    FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_BROADCAST |
    FERRY_TRANSPORT_CAP_SAME_NODE_ONLY | FERRY_TRANSPORT_CAP_DIRECT_WRITE |
    FERRY_TRANSPORT_CAP_ASYNC | FERRY_TRANSPORT_CAP_SOURCE | FERRY_TRANSPORT_CAP_PUT_FINGERPRINT |
    FERRY_TRANSPORT_CAP_PUT_DEFERRED | FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES |
    FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS | FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES;
static_assert(EverythingTable::kFlags == kEveryFlag);
// The table is a constant: a plugin may copy it into a table of its own at load time.
constinit const ferry_transport_api_t kCopied = PeersTable::kApi;

ferry_transport_caps_t caps_of(const ferry_transport_api_t& api) {
  ferry_transport_caps_t caps{};
  caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
  EXPECT_EQ(take(api.get_caps(&caps)).code, FERRY_STATUS_OK);
  return caps;
}

ferry_transport_t* create(const ferry_transport_api_t& api) {
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_RECEIVER;
  args.device = -1;
  ferry_transport_t* t = nullptr;
  EXPECT_EQ(take(api.create(&args, &t)).code, FERRY_STATUS_OK);
  EXPECT_NE(t, nullptr);
  return t;
}

TEST_F(TransportPluginTest, SomeGroupsGetExactlyTheirBitsAndNullForTheRest) {
  const ferry_transport_api_t& api = *PeersTable::api();
  EXPECT_EQ(api.struct_size, FERRY_STRUCT_SIZE(ferry_transport_api_t, map_peer_memory));
  const auto caps = caps_of(api);
  EXPECT_EQ(caps.flags, FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY);
  EXPECT_EQ(caps.memory_kinds, static_cast<std::uint32_t>(FERRY_MEMORY_HOST));
  EXPECT_EQ(caps.preferred_bucket_bytes, 1u << 20);
  EXPECT_EQ(caps.max_inflight_buckets, 2u);
  for (auto fn :
       {reinterpret_cast<const void*>(api.get_caps), reinterpret_cast<const void*>(api.create),
        reinterpret_cast<const void*>(api.destroy), reinterpret_cast<const void*>(api.get_address),
        reinterpret_cast<const void*>(api.connect), reinterpret_cast<const void*>(api.disconnect),
        reinterpret_cast<const void*>(api.send_bucket),
        reinterpret_cast<const void*>(api.recv_bucket),
        reinterpret_cast<const void*>(api.register_memory),
        reinterpret_cast<const void*>(api.deregister_memory),
        reinterpret_cast<const void*>(api.abort)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_EQ(api.pack_key, nullptr);
  EXPECT_EQ(api.put, nullptr);
  EXPECT_EQ(api.flush, nullptr);
  EXPECT_EQ(api.put_many, nullptr);
  EXPECT_EQ(api.request_test, nullptr);
  EXPECT_EQ(api.request_wait, nullptr);
  EXPECT_EQ(api.request_free, nullptr);
  EXPECT_EQ(api.source_open, nullptr);
  EXPECT_EQ(api.source_catalog, nullptr);
  EXPECT_EQ(api.source_read, nullptr);
  EXPECT_EQ(api.source_close, nullptr);
  EXPECT_EQ(api.alloc_memory, nullptr);
  EXPECT_EQ(api.prepare_puts, nullptr);
  EXPECT_EQ(api.map_peer_memory, nullptr);
  EXPECT_EQ(std::memcmp(&kCopied, &api, sizeof api), 0);
}

TEST_F(TransportPluginTest, ASourceGetsOnlyTheSourceEntriesAndBit) {
  const ferry_transport_api_t& api = *SourceTable::api();
  EXPECT_EQ(caps_of(api).flags, static_cast<std::uint32_t>(FERRY_TRANSPORT_CAP_SOURCE));
  EXPECT_EQ(api.get_address, nullptr);
  EXPECT_EQ(api.connect, nullptr);
  EXPECT_EQ(api.send_bucket, nullptr);
  EXPECT_EQ(api.register_memory, nullptr);
  EXPECT_EQ(api.abort, nullptr);
  EXPECT_EQ(api.request_free, nullptr);
  ASSERT_NE(api.source_open, nullptr);
  ASSERT_NE(api.source_close, nullptr);

  ferry_transport_t* t = create(api);
  ferry_source_t* s = nullptr;
  ASSERT_EQ(take(api.source_open(t, "file:///x", &s)).code, FERRY_STATUS_OK);
  ferry_blob_t catalog{};
  ASSERT_EQ(take(api.source_catalog(s, &catalog)).code, FERRY_STATUS_OK);
  EXPECT_EQ(std::vector<std::uint8_t>(catalog.data, catalog.data + catalog.size),
            (std::vector<std::uint8_t>{1, 2, 3}));
  catalog.release(catalog.data, catalog.release_ctx);
  std::vector<std::uint8_t> dst(16);
  ferry_source_read_args_t read{};
  read.struct_size = FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written);
  read.dst = dst.data();
  read.dst_capacity = dst.size();
  ASSERT_EQ(take(api.source_read(s, &read)).code, FERRY_STATUS_OK);
  EXPECT_EQ(read.bytes_written, 16u);
  ASSERT_EQ(read.manifest.size, 1u);
  read.manifest.release(read.manifest.data, read.manifest.release_ctx);
  read.dst_capacity = 0;
  const Outcome end = take(api.source_read(s, &read));
  EXPECT_EQ(end.code, FERRY_STATUS_END_OF_STREAM);
  EXPECT_EQ(end.message, "test: no more buckets");
  EXPECT_EQ(read.manifest.data, nullptr);  // cleared before the read
  read.dst = nullptr;
  read.dst_capacity = 8;
  EXPECT_EQ(take(api.source_read(s, &read)).message, "src source_read: dst is NULL");
  api.source_close(s);
  api.destroy(t);
}

TEST_F(TransportPluginTest, EveryGroupFillsTheWholeTable) {
  const ferry_transport_api_t& api = *EverythingTable::api();
  EXPECT_EQ(caps_of(api).flags, kEveryFlag);
  ferry_transport_t* t = create(api);
  ferry_put_args_t a{};
  a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
  const ferry_put_args_t* puts[] = {&a, &a, &a};
  ferry_peer_t peer{};
  EXPECT_EQ(take(api.put_many(t, &peer, puts, 3)).code, FERRY_STATUS_OK);
  EXPECT_EQ(reinterpret_cast<Everything*>(t)->last_put_many, 3u);
  const Outcome no_args = take(api.put_many(t, &peer, nullptr, 2));
  EXPECT_EQ(no_args.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(no_args.message, "all put_many: args is NULL");
  EXPECT_EQ(take(api.put_many(t, &peer, nullptr, 0)).code, FERRY_STATUS_OK);
  // prepare_puts: the keys reach the method; NULL keys or a key without bytes are refused.
  const std::uint8_t key_bytes[] = {7};
  const ferry_blob_t keys[] = {{.struct_size = sizeof(ferry_blob_t), .data = key_bytes, .size = 1},
                               {.struct_size = sizeof(ferry_blob_t), .data = key_bytes, .size = 1}};
  EXPECT_EQ(take(api.prepare_puts(t, &peer, keys, 2, 0)).code, FERRY_STATUS_OK);
  EXPECT_EQ(reinterpret_cast<Everything*>(t)->last_prepared, 2u);
  EXPECT_EQ(take(api.prepare_puts(t, &peer, nullptr, 1, 0)).message,
            "all prepare_puts: keys is NULL");
  const ferry_blob_t hollow[] = {{.struct_size = sizeof(ferry_blob_t), .data = nullptr, .size = 3}};
  EXPECT_EQ(take(api.prepare_puts(t, &peer, hollow, 1, 0)).message,
            "all prepare_puts: key 0 has no bytes");
  EXPECT_EQ(take(api.prepare_puts(t, nullptr, keys, 2, 0)).message,
            "all prepare_puts: peer is NULL");
  // map_peer_memory: the method's address comes out; a key without bytes or no out is refused.
  const void* mapped = nullptr;
  EXPECT_EQ(take(api.map_peer_memory(t, &peer, &keys[0], 0, 1, 0, &mapped)).code, FERRY_STATUS_OK);
  EXPECT_EQ(mapped, key_bytes);
  EXPECT_EQ(take(api.map_peer_memory(t, &peer, &hollow[0], 0, 1, 0, &mapped)).message,
            "all map_peer_memory: the key has no bytes");
  EXPECT_EQ(take(api.map_peer_memory(t, &peer, &keys[0], 0, 1, 0, nullptr)).message,
            "all map_peer_memory: data_out is NULL");
  EXPECT_EQ(take(api.map_peer_memory(t, nullptr, &keys[0], 0, 1, 0, &mapped)).message,
            "all map_peer_memory: peer is NULL");
  // alloc_memory: data and registration out; a desc with a base (or no size) is refused.
  ferry_memory_desc_t desc{};
  desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
  desc.size = 4096;
  desc.kind = FERRY_MEMORY_HOST;
  void* data = nullptr;
  ferry_memory_t* m = nullptr;
  EXPECT_EQ(take(api.alloc_memory(t, &desc, &data, &m)).code, FERRY_STATUS_OK);
  EXPECT_EQ(data, reinterpret_cast<Everything*>(t)->allocated.data());
  ASSERT_NE(m, nullptr);
  api.deregister_memory(t, m);
  desc.base = data;
  const Outcome with_base = take(api.alloc_memory(t, &desc, &data, &m));
  EXPECT_EQ(with_base.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with_base.message, "all alloc_memory: base must be NULL and size not 0");
  EXPECT_EQ(data, nullptr);
  EXPECT_EQ(m, nullptr);
  api.destroy(t);
}

// ferry::Error keeps its code and message, std::bad_alloc is OUT_OF_MEMORY, anything else
// INTERNAL: as sdk::guard does for every plugin.
TEST_F(TransportPluginTest, AnExceptionBecomesTheRightStatusAndMessage) {
  const ferry_transport_api_t& api = *PeersTable::api();
  ferry_transport_t* t = create(api);
  ferry_blob_t address{};
  ASSERT_EQ(take(api.get_address(t, &address)).code, FERRY_STATUS_OK);
  ferry_connect_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
  args.remote_addresses = &address;
  args.num_remote = 1;
  args.local_rank = 1;
  args.group_size = 2;
  struct Case {
    Throw what;
    ferry_status_code_t code;
    const char* message;
  };
  for (const Case& c : {Case{Throw::kFerryError, FERRY_STATUS_TIMEOUT, "peer 'r1' passed bucket 3"},
                        Case{Throw::kBadAlloc, FERRY_STATUS_OUT_OF_MEMORY, "out of host memory"},
                        Case{Throw::kStdException, FERRY_STATUS_INTERNAL, "a bug in the transport"},
                        Case{Throw::kInt, FERRY_STATUS_INTERNAL, "unknown exception"}}) {
    g_throw = c.what;
    ferry_peer_t* peer = reinterpret_cast<ferry_peer_t*>(0x1);
    const Outcome o = take(api.connect(t, &args, &peer));
    g_throw = Throw::kNothing;
    EXPECT_EQ(o.code, c.code) << c.message;
    EXPECT_EQ(o.message, c.message);
    EXPECT_EQ(peer, nullptr);  // out is cleared before the call
  }
  ferry_peer_t* peer = nullptr;
  ASSERT_EQ(take(api.connect(t, &args, &peer)).code, FERRY_STATUS_OK);
  EXPECT_EQ(peer->id, 1);
  api.abort(t, nullptr);
  EXPECT_EQ(reinterpret_cast<PeersOnly*>(t)->aborts, 1);
  api.disconnect(t, peer);
  address.release(address.data, address.release_ctx);
  api.destroy(t);
}

// The checks every entry makes once: NULL handles and short structs are INVALID_ARGUMENT naming
// the plugin, the call and the argument; nothing reaches the class.
TEST_F(TransportPluginTest, NullAndShortArgumentsAreRefusedBeforeTheClass) {
  const ferry_transport_api_t& api = *PeersTable::api();
  PeersOnlyPlugin::creates = 0;
  ferry_transport_t* t = nullptr;
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, role);
  Outcome o = take(api.create(&args, &t));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "peers create: create args is NULL or its struct_size is too small");
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, num_options);
  args.num_options = 1;
  o = take(api.create(&args, &t));
  EXPECT_EQ(o.message, "peers create: num_options > 0 but options is NULL");
  EXPECT_EQ(take(api.create(nullptr, &t)).code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(take(api.create(&args, nullptr)).message, "peers create: out is NULL");
  EXPECT_EQ(PeersOnlyPlugin::creates, 0);
  const ferry_option_t option{"colour", "red"};
  args.options = &option;
  o = take(api.create(&args, &t));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "peers: unknown option 'colour'");

  t = create(api);
  ferry_bucket_io_t bucket{};
  bucket.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, bucket_index);  // no deadline_ns
  ferry_peer_t peer{};
  ferry_request_t* r = nullptr;
  o = take(api.send_bucket(t, &peer, &bucket, &r));
  EXPECT_EQ(o.message, "peers send_bucket: bucket is NULL or its struct_size is too small");
  bucket.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
  EXPECT_EQ(take(api.send_bucket(t, nullptr, &bucket, &r)).message,
            "peers send_bucket: peer is NULL");
  EXPECT_EQ(take(api.send_bucket(nullptr, &peer, &bucket, &r)).message,
            "peers send_bucket: transport is NULL");
  EXPECT_EQ(take(api.recv_bucket(t, &peer, &bucket, nullptr)).message,
            "peers recv_bucket: out is NULL");
  EXPECT_EQ(take(api.get_address(t, nullptr)).message, "peers get_address: out is NULL");
  ferry_transport_caps_t caps{};
  EXPECT_EQ(take(api.get_caps(&caps)).message,
            "peers get_caps: caps is NULL or has no struct_size");
  // A short caps struct: nothing past it is written.
  struct {
    ferry_transport_caps_t caps;
    unsigned char tail[8];
  } guarded;
  std::memset(&guarded, 0xAB, sizeof guarded);
  guarded.caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, flags);
  ASSERT_EQ(take(api.get_caps(&guarded.caps)).code, FERRY_STATUS_OK);
  EXPECT_EQ(guarded.caps.flags,
            FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY);
  EXPECT_EQ(guarded.caps.memory_kinds, 0xABABABABu);
  // The void functions ignore NULL handles.
  api.disconnect(t, nullptr);
  api.deregister_memory(t, nullptr);
  api.abort(nullptr, "x");
  api.destroy(t);
  api.destroy(nullptr);
}

// negotiate answers with the family's name, version, option keys and table.
TEST_F(TransportPluginTest, NegotiateAnswersWithTheFamily) {
  for (auto [negotiate, name, keys, api] :
       {std::tuple{&PeersTable::negotiate, "peers", sdk::kNoOptions, PeersTable::api()},
        std::tuple{&SourceTable::negotiate, "src", static_cast<const char* const*>(nullptr),
                   SourceTable::api()},
        std::tuple{&EverythingTable::negotiate, "all", sdk::kNoOptions, EverythingTable::api()}}) {
    ferry_plugin_negotiation_t n{};
    n.struct_size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, option_keys);
    n.host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
    n.host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
    n.host = &kHost;
    ASSERT_EQ(take(negotiate(&n)).code, FERRY_STATUS_OK);
    EXPECT_EQ(n.kind, FERRY_PLUGIN_TRANSPORT);
    EXPECT_STREQ(n.name, name);
    EXPECT_STREQ(n.version, "0");
    EXPECT_EQ(n.option_keys, keys);
    EXPECT_EQ(n.api, api);
  }
}

TEST(OwnedBlob, ReleaseFreesWhatItHolds) {
  ferry_blob_t blob = sdk::owned_blob({4, 5});
  EXPECT_EQ(blob.struct_size, FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx));
  ASSERT_EQ(blob.size, 2u);
  EXPECT_EQ(blob.data[1], 5);
  blob.release(blob.data, blob.release_ctx);  // under ASan: no leak
}

}  // namespace
