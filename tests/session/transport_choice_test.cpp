// Which data transport a sender uses per receiver, without a GPU: "auto" takes the first plugin
// of the preference list whose declared capabilities fit (with the default list: cuda_ipc only
// for CUDA tensors and a receiver on this host in another process, then ucx, then inline); a
// same-node-only plugin is refused for a receiver on another host with a message naming it;
// is_this_host tells loopback and local interface addresses from others. With the cuda_ipc plugin built (it loads without a
// GPU): an in-process Sender refuses a remote receiver before connecting, and a receiver that
// keeps its weights on the cpu refuses a push that requires cuda_ipc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ferry/sdk/error.hpp>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "config/config.hpp"
#include "registry/registry.hpp"
#include "session/transport_choice.hpp"
#include "session_fixture.hpp"

namespace ferry::test {
namespace {

using session::TransportChoice;
using session::TransportFacts;
using session::TransportQuery;

// Plugin facts as a registry with `present` plugins would give them.
std::function<TransportFacts(const std::string&)> facts_of(
    std::map<std::string, TransportFacts> present, std::vector<std::string>* asked = nullptr) {
  return [present = std::move(present), asked](const std::string& name) {
    if (asked != nullptr) asked->push_back(name);
    if (auto it = present.find(name); it != present.end()) return it->second;
    TransportFacts f;
    f.error = "no plugin '" + name + "'";
    return f;
  };
}

TransportFacts cuda_ipc_facts() {
  TransportFacts f;
  f.loadable = true;
  f.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_SAME_NODE_ONLY |
            FERRY_TRANSPORT_CAP_DIRECT_WRITE | FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES;
  f.memory_kinds = FERRY_MEMORY_CUDA | FERRY_MEMORY_PINNED;
  return f;
}

TransportFacts ucx_facts() {
  TransportFacts f;
  f.loadable = true;
  f.flags = FERRY_TRANSPORT_CAP_POINT_TO_POINT | FERRY_TRANSPORT_CAP_DIRECT_WRITE;
  f.memory_kinds = FERRY_MEMORY_HOST;
  return f;
}

TransportQuery query(const std::string& requested, bool local, bool cuda) {
  TransportQuery q;
  q.requested = requested;
  q.receiver = local ? "127.0.0.1:30000" : "10.0.0.2:30000";
  q.receiver_on_this_host = local;
  q.cuda_tensors = cuda;
  q.preference = config::Config{}.update.transport_preference;
  return q;
}

TEST(TransportChoice, AutoPicksCudaIpcForCudaTensorsAndALocalReceiver) {
  const auto c = session::choose_transport(
      query("auto", true, true), facts_of({{"cuda_ipc", cuda_ipc_facts()}, {"ucx", ucx_facts()}}));
  EXPECT_EQ(c.name, "cuda_ipc");
  EXPECT_FALSE(c.required);
}

TEST(TransportChoice, AutoPicksUcxForHostTensorsOrARemoteReceiver) {
  const auto both = facts_of({{"cuda_ipc", cuda_ipc_facts()}, {"ucx", ucx_facts()}});
  EXPECT_EQ(session::choose_transport(query("auto", true, false), both).name, "ucx");
  EXPECT_EQ(session::choose_transport(query("auto", false, true), both).name, "ucx");
}

TEST(TransportChoice, AutoFallsBackToInlineAndSaysWhy) {
  std::vector<std::string> asked;
  const auto c = session::choose_transport(query("auto", true, true), facts_of({}, &asked));
  EXPECT_EQ(c.name, "inline");
  EXPECT_FALSE(c.required);
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda_ipc", "ucx"}));
  EXPECT_NE(c.why.find("no plugin 'cuda_ipc'"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("no plugin 'ucx'"), std::string::npos) << c.why;
}

// An engine that embeds its receiver and pushes to it from the same process: a process cannot
// open the CUDA IPC handles it made (cuda_ipc declares SEPARATE_PROCESSES), so auto passes
// cuda_ipc over (saying why) and asking for it is refused, naming the receiver.
TEST(TransportChoice, AReceiverInThisProcessIsNeverGivenCudaIpc) {
  auto q = query("auto", true, true);
  q.receiver_in_this_process = true;
  std::vector<std::string> asked;
  const auto c = session::choose_transport(
      q, facts_of({{"cuda_ipc", cuda_ipc_facts()}, {"ucx", ucx_facts()}}, &asked));
  EXPECT_EQ(c.name, "ucx");
  EXPECT_FALSE(c.required);
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda_ipc", "ucx"}));
  EXPECT_NE(c.why.find("the receiver is in this process"), std::string::npos) << c.why;
  q.requested = "cuda_ipc";
  try {
    session::choose_transport(q, facts_of({{"cuda_ipc", cuda_ipc_facts()}}));
    FAIL() << "cuda_ipc was accepted for a receiver in this process";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:30000"), std::string::npos) << e.what();
  }
}

// A vendor's plugin at the head of the list is chosen wherever its capabilities fit, and passed
// over (saying why) where they do not: the host knows it only by its capability bits.
TEST(TransportChoice, AutoTakesTheFirstPreferredPluginWhoseCapabilitiesFit) {
  TransportFacts rdma = ucx_facts();
  TransportFacts shm = ucx_facts();
  shm.flags |= FERRY_TRANSPORT_CAP_SAME_NODE_ONLY;
  TransportFacts group;
  group.loadable = true;
  group.flags = FERRY_TRANSPORT_CAP_BROADCAST;
  group.memory_kinds = FERRY_MEMORY_CUDA;
  const auto facts = facts_of({{"vendor_rdma", rdma}, {"vendor_shm", shm},
                               {"vendor_group", group}, {"ucx", ucx_facts()}});
  auto q = query("auto", false, false);
  q.preference = {"vendor_group", "vendor_shm", "vendor_rdma", "ucx"};
  auto c = session::choose_transport(q, facts);
  EXPECT_EQ(c.name, "vendor_rdma");
  EXPECT_FALSE(c.required);
  EXPECT_NE(c.why.find("not vendor_group: not a point-to-point transport"), std::string::npos)
      << c.why;
  EXPECT_NE(c.why.find("not vendor_shm: works only between processes of one host"),
            std::string::npos)
      << c.why;
  q.receiver_on_this_host = true;
  EXPECT_EQ(session::choose_transport(q, facts).name, "vendor_shm");
  // A device-only transport is passed over for host tensors.
  q.preference = {"cuda_ipc", "vendor_rdma"};
  const auto with_ipc = facts_of({{"cuda_ipc", cuda_ipc_facts()}, {"vendor_rdma", rdma}});
  c = session::choose_transport(q, with_ipc);
  EXPECT_EQ(c.name, "vendor_rdma");
  EXPECT_NE(c.why.find("moves CUDA memory"), std::string::npos) << c.why;
  // An empty list: inline.
  q.preference.clear();
  EXPECT_EQ(session::choose_transport(q, facts).name, "inline");
}

// Asking for a plugin by name checks the same capability bits, whatever the plugin is called.
TEST(TransportChoice, AskedForPluginIsRefusedByItsCapabilitiesNotItsName) {
  TransportFacts vendor = cuda_ipc_facts();
  auto q = query("vendor_ipc", true, true);
  q.receiver_in_this_process = true;
  try {
    session::choose_transport(q, facts_of({{"vendor_ipc", vendor}}));
    FAIL() << "a separate-processes transport was accepted for a receiver in this process";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_NE(std::string(e.what()).find("'vendor_ipc'"), std::string::npos) << e.what();
  }
  vendor.flags &= ~FERRY_TRANSPORT_CAP_SEPARATE_PROCESSES;
  EXPECT_EQ(session::choose_transport(q, facts_of({{"vendor_ipc", vendor}})).name, "vendor_ipc");
}

TEST(TransportChoice, AskedForPluginIsRequired) {
  const auto c = session::choose_transport(query("cuda_ipc", true, false),
                                           facts_of({{"cuda_ipc", cuda_ipc_facts()}}));
  EXPECT_EQ(c.name, "cuda_ipc");
  EXPECT_TRUE(c.required);
  const auto i = session::choose_transport(query("inline", true, true), facts_of({}));
  EXPECT_EQ(i.name, "inline");
  EXPECT_TRUE(i.required);
}

TEST(TransportChoice, SameNodeOnlyPluginRefusesARemoteReceiverNamingIt) {
  try {
    session::choose_transport(query("cuda_ipc", false, true),
                              facts_of({{"cuda_ipc", cuda_ipc_facts()}}));
    FAIL() << "a remote receiver was accepted for cuda_ipc";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    const std::string what = e.what();
    EXPECT_NE(what.find("10.0.0.2:30000"), std::string::npos) << what;
    EXPECT_NE(what.find("only between processes of one host"), std::string::npos) << what;
  }
  // A plugin without the same-node flag is fine for a remote receiver.
  EXPECT_EQ(session::choose_transport(query("ucx", false, true), facts_of({{"ucx", ucx_facts()}}))
                .name,
            "ucx");
}

TEST(TransportChoice, LoopbackAndOwnNameAreThisHostOthersAreNot) {
  EXPECT_TRUE(session::is_this_host("127.0.0.1"));
  EXPECT_TRUE(session::is_this_host("localhost"));
  EXPECT_TRUE(session::is_this_host("::1"));
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_TRUE(session::is_this_host(name));
  // TEST-NET-3 (RFC 5737): never an address of this machine.
  EXPECT_FALSE(session::is_this_host("203.0.113.7"));
  EXPECT_FALSE(session::is_this_host("receiver.invalid"));
  EXPECT_FALSE(session::is_this_host(""));
}

// The build folder of the cuda_ipc plugin, or empty when it is not built.
std::filesystem::path cuda_ipc_dir() {
  const char* path = std::getenv("FERRY_CUDA_IPC_PLUGIN");
  if (path == nullptr || !std::filesystem::exists(path)) return {};
  return std::filesystem::path(path).parent_path();
}

TEST(TransportChoice, SenderRefusesARemoteReceiverForCudaIpcBeforeConnecting) {
  const auto dir = cuda_ipc_dir();
  if (dir.empty()) GTEST_SKIP() << "the cuda_ipc plugin is not built";
  config::Config config;
  registry::Registry registry({dir});
  session::SenderOptions options;
  options.receivers = {"203.0.113.7:30000"};
  options.transport = "cuda_ipc";
  options.connect_timeout = std::chrono::milliseconds(200);
  session::Sender sender(config, registry, options);
  std::vector<std::uint8_t> bytes(64, 1);
  std::vector<session::TensorView> views = {
      {"w", FERRY_DTYPE_U8, {64}, bytes.data(), FERRY_MEMORY_HOST, 0}};
  const auto report = sender.push(views, 1);
  ASSERT_EQ(report.receivers.size(), 1u);
  const auto& r = report.receivers[0];
  EXPECT_FALSE(r.committed);
  EXPECT_EQ(r.code, FERRY_STATUS_INCOMPATIBLE) << r.error;
  EXPECT_NE(r.error.find("only between processes of one host"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("203.0.113.7:30000"), std::string::npos) << r.error;
}

TEST(TransportChoice, CpuReceiverRefusesAPushThatRequiresCudaIpc) {
  if (cuda_ipc_dir().empty()) GTEST_SKIP() << "the cuda_ipc plugin is not built";
  TwoVersions versions;
  ServeProcess serve(receiver_options(versions.v1_path()));
  const auto push = run_ferry({"--log-level", "warn", "push", "--to", address_of(serve),
                               "--transport", "cuda_ipc", "--model-path", versions.v2_path(),
                               "--version", "2"});
  ASSERT_TRUE(push.exited) << push.output;
  EXPECT_NE(push.status, 0) << push.output;
  EXPECT_NE(push.output.find("moves CUDA memory only"), std::string::npos) << push.output;
  EXPECT_EQ(version_of(serve), 1);
  EXPECT_EQ(serve.fingerprints(), expected_fingerprints(versions.v1, 0, 1));
}

}  // namespace
}  // namespace ferry::test
