// tests/cuda_ipc/plugin_test.cpp: libferry_transport_cuda_ipc.so through its C table on any
// machine (no GPU needed): it declares same-node point-to-point direct writes, refuses unknown
// options, connects two instances over its Unix sockets, refuses to share host memory, refuses a
// key of an earlier incarnation as stale, tells no peer of a registration it never offered, refuses
// a bad put of a put_many naming it, and fails a posted receive naming the peer when the peer's
// instance goes away.
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "ipc_wire.hpp"
#include "plugin_client.hpp"

namespace ferry::cuda_ipc::test {
namespace {

ferry_status_code_t code_and_message(ferry_error_t* raw, std::string* message) {
  ErrorPtr e(raw);
  *message = error_message(e.get());
  return error_code(e.get());
}

TEST(CudaIpcPlugin, DeclaresSameNodeDirectWritesThatFingerprint) {
  ferry_transport_caps_t caps{};
  caps.struct_size = sizeof caps;
  ErrorPtr e(plugin()->get_caps(&caps));
  ASSERT_FALSE(e) << error_message(e.get());
  EXPECT_EQ(caps.flags, FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY |
                            FERRY_TRANSPORT_CAP_DIRECT_WRITE | FERRY_TRANSPORT_CAP_ASYNC |
                            FERRY_TRANSPORT_CAP_PUT_FINGERPRINT | FERRY_TRANSPORT_CAP_PUT_DEFERRED |
                            FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES |
                            FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES);
  EXPECT_EQ(caps.memory_kinds, static_cast<std::uint32_t>(FERRY_MEMORY_CUDA | FERRY_MEMORY_PINNED));
  for (auto fn : {reinterpret_cast<void*>(plugin()->put), reinterpret_cast<void*>(plugin()->flush),
                  reinterpret_cast<void*>(plugin()->pack_key),
                  reinterpret_cast<void*>(plugin()->send_bucket),
                  reinterpret_cast<void*>(plugin()->recv_bucket),
                  reinterpret_cast<void*>(plugin()->request_wait)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_EQ(plugin()->source_open, nullptr);
}

TEST(CudaIpcPlugin, RefusesUnknownOptions) {
  ferry_option_t option{"nvlink", "1"};
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_SENDER;
  args.options = &option;
  args.num_options = 1;
  ferry_transport_t* t = nullptr;
  std::string message;
  EXPECT_EQ(code_and_message(plugin()->create(&args, &t), &message), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(message.find("unknown option 'nvlink'"), std::string::npos) << message;
  EXPECT_EQ(t, nullptr);
}

TEST(CudaIpcPlugin, HostMemoryIsLocalOnly) {
  Transport t(FERRY_ROLE_RECEIVER, -1);
  std::vector<std::uint8_t> host(4096);
  ferry_memory_t* m = t.register_memory(host.data(), host.size(), FERRY_MEMORY_HOST, -1);
  ferry_blob_t key{};
  std::string message;
  EXPECT_EQ(code_and_message(plugin()->pack_key(t.get(), m, &key), &message),
            FERRY_STATUS_UNIMPLEMENTED);
  EXPECT_NE(message.find("only CUDA device memory can be shared"), std::string::npos) << message;
}

TEST(CudaIpcPlugin, KeyOfAnEarlierIncarnationIsRefusedAsStale) {
  Transport sender(FERRY_ROLE_SENDER, -1);
  std::vector<std::uint8_t> old_key;
  {
    // The key a receiver incarnation packs names its nonce; this one goes away right after.
    Transport old_receiver(FERRY_ROLE_RECEIVER, -1);
    const Address address = decode_address(old_receiver.address());
    old_key = encode_key(Key{address.nonce, 1, 0, 4096, ShareKind::Vmm});
  }
  Transport new_receiver(FERRY_ROLE_RECEIVER, -1);
  sender.connect(new_receiver.address(), "receiver r2");
  ferry_blob_t k = borrow(old_key);
  ferry_put_args_t a{};
  a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
  a.remote_key = &k;
  a.deadline_ns = in_seconds(10);
  ferry_request_t* r = nullptr;
  std::string message;
  EXPECT_EQ(code_and_message(plugin()->put(sender.get(), sender.peer(), &a, &r), &message),
            FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(message.find("stale key"), std::string::npos) << message;
  EXPECT_NE(message.find("receiver r2"), std::string::npos) << message;
  EXPECT_EQ(r, nullptr);
}

// put_many (ABI 1.2) checks each put as put does and names the one that fails.
TEST(CudaIpcPlugin, PutManyRefusesABadPutNamingIt) {
  Transport receiver(FERRY_ROLE_RECEIVER, -1);
  Transport sender(FERRY_ROLE_SENDER, -1);
  sender.connect(receiver.address(), "receiver r");
  std::vector<std::uint8_t> host(4096);
  ferry_memory_t* m = sender.register_memory(host.data(), host.size(), FERRY_MEMORY_HOST, -1);
  const auto key =
      encode_key(Key{decode_address(receiver.address()).nonce, 1, 0, 4096, ShareKind::Vmm});
  ferry_blob_t k = borrow(key);
  ferry_put_args_t past_the_end{};
  past_the_end.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
  past_the_end.local = Transport::range(m, 0, 1024);
  past_the_end.remote_key = &k;
  past_the_end.remote_offset = 3584;  // 1024 bytes from here pass the key's 4096
  past_the_end.deadline_ns = in_seconds(10);
  ferry_put_args_t no_key = past_the_end;
  no_key.remote_key = nullptr;
  std::string message;
  {
    const ferry_put_args_t* args[] = {&past_the_end};
    EXPECT_EQ(code_and_message(plugin()->put_many(sender.get(), sender.peer(), args, 1), &message),
              FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(message.find("1024 bytes at offset 3584 exceed"), std::string::npos) << message;
    EXPECT_NE(message.find("receiver r"), std::string::npos) << message;
  }
  {
    const ferry_put_args_t* args[] = {&no_key};
    EXPECT_EQ(code_and_message(plugin()->put_many(sender.get(), sender.peer(), args, 1), &message),
              FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(message.find("remote_key is NULL"), std::string::npos) << message;
  }
  EXPECT_EQ(code_and_message(plugin()->put_many(sender.get(), sender.peer(), nullptr, 2), &message),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(message.find("args is NULL"), std::string::npos) << message;
  // Nothing to queue is no error.
  EXPECT_EQ(code_and_message(plugin()->put_many(sender.get(), sender.peer(), nullptr, 0), &message),
            FERRY_STATUS_OK);
}

TEST(CudaIpcPlugin, ARegistrationNoPeerWasOfferedIsDeregisteredWithoutTellingThem) {
  // A sender registers every tensor it puts from and deregisters it after the push: thousands
  // a push, none of them ever offered to a peer (only pack_key and send_bucket do that). Telling
  // every peer of each (Revoked) cost a MoE push ~2 ms and grew each peer's set of revoked ids
  // by thousands a push. Host memory is never offered (it cannot be shared), so a key forged
  // for it is never refused as revoked: the put goes on to its missing local memory.
  Transport receiver(FERRY_ROLE_RECEIVER, -1);
  Transport sender(FERRY_ROLE_SENDER, -1);
  std::vector<std::uint8_t> host(4096);
  ferry_memory_t* m = receiver.register_memory(host.data(), host.size(), FERRY_MEMORY_HOST, -1);
  // The key this instance's first registration (id 1) would have, laid out as pack_key does.
  const auto key = encode_key(Key{decode_address(receiver.address()).nonce, 1, 0, 4096,
                                  ShareKind::Vmm});
  sender.connect(receiver.address(), "receiver r");
  receiver.connect(sender.address(), "sender s");
  receiver.deregister(m);
  ferry_blob_t k = borrow(key);
  ferry_put_args_t a{};
  a.struct_size = FERRY_STRUCT_SIZE(ferry_put_args_t, deadline_ns);
  a.remote_key = &k;  // no local memory: a put that gets past the key checks fails on that
  a.deadline_ns = in_seconds(10);
  // A Revoked would cross the receiver's socket within milliseconds; 300 ms of puts see none.
  for (int i = 0; i < 300; ++i) {
    std::string message;
    ferry_request_t* r = nullptr;
    ASSERT_EQ(code_and_message(plugin()->put(sender.get(), sender.peer(), &a, &r), &message),
              FERRY_STATUS_INVALID_ARGUMENT)
        << message;
    ASSERT_NE(message.find("the local memory is not registered"), std::string::npos) << message;
    ::usleep(1000);
  }
}

TEST(CudaIpcPlugin, PostedReceiveFailsNamingAPeerThatWentAway) {
  Transport receiver(FERRY_ROLE_RECEIVER, -1);
  std::vector<std::uint8_t> host(4096);
  ferry_memory_t* slot = receiver.register_memory(host.data(), host.size(), FERRY_MEMORY_PINNED, -1);
  auto sender = std::make_unique<Transport>(FERRY_ROLE_SENDER, -1);
  sender->connect(receiver.address(), "receiver r");
  receiver.connect(sender->address(), "sender s");
  ferry_request_t* r = receiver.recv_bucket(slot, host.size(), 0);
  ASSERT_NE(r, nullptr);
  int done = 1;
  ErrorPtr not_yet(plugin()->request_test(receiver.get(), r, &done));
  EXPECT_FALSE(not_yet) << error_message(not_yet.get());
  EXPECT_EQ(done, 0);
  sender.reset();  // the sender's instance is destroyed: its sockets close
  std::string message;
  // A far deadline: the wait ends because the peer went away.
  EXPECT_EQ(code_and_message(plugin()->request_wait(receiver.get(), r, in_seconds(60)), &message),
            FERRY_STATUS_PEER_FAILED);
  EXPECT_NE(message.find("sender s"), std::string::npos) << message;
  plugin()->request_free(receiver.get(), r);
}

TEST(CudaIpcPlugin, AbortEndsAWaitWithTheReason) {
  Transport receiver(FERRY_ROLE_RECEIVER, -1);
  Transport sender(FERRY_ROLE_SENDER, -1);
  std::vector<std::uint8_t> host(64);
  ferry_memory_t* slot = receiver.register_memory(host.data(), host.size(), FERRY_MEMORY_HOST, -1);
  receiver.connect(sender.address(), "sender s");
  ferry_request_t* r = receiver.recv_bucket(slot, host.size(), 5);
  plugin()->abort(receiver.get(), "update cancelled");
  std::string message;
  EXPECT_EQ(code_and_message(plugin()->request_wait(receiver.get(), r, in_seconds(60)), &message),
            FERRY_STATUS_ABORTED);
  EXPECT_NE(message.find("update cancelled"), std::string::npos) << message;
  plugin()->request_free(receiver.get(), r);
}

}  // namespace
}  // namespace ferry::cuda_ipc::test
