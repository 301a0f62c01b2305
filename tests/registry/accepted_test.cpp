// tests/registry/accepted_test.cpp: accepted plugins are listed with the right info, their tables
// work through the registry's copies, and lookups name what is missing and why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ferry/sdk/error.hpp>

#include <cstring>
#include <vector>

#include "common/host_api.hpp"
#include "plugin_files.hpp"
#include "registry/loader.hpp"
#include "registry/registry.hpp"

namespace ferry::registry {
namespace {

using ferry::testing::TempDir;
using ::testing::HasSubstr;

TEST(RegistryAccepts, MockTransportIsListedWithItsCapabilities) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto path = ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  Registry reg({dir});
  EXPECT_TRUE(reg.refused().empty());
  const auto plugin = reg.transport("mock");
  const PluginInfo& info = plugin->info();
  EXPECT_EQ(info.name, "mock");
  EXPECT_EQ(info.kind, FERRY_PLUGIN_TRANSPORT);
  EXPECT_EQ(info.path, path);
  EXPECT_EQ(info.abi_major, 1u);
  EXPECT_EQ(info.abi_minor, static_cast<unsigned>(FERRY_PLUGIN_ABI_MINOR));
  EXPECT_EQ(info.version, "0.1-test");
  ASSERT_TRUE(info.transport_caps.has_value());
  EXPECT_EQ(info.transport_caps->flags,
            static_cast<std::uint32_t>(FERRY_TRANSPORT_CAP_POINT_TO_POINT));
  EXPECT_EQ(info.transport_caps->memory_kinds,
            static_cast<std::uint32_t>(FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED));
  EXPECT_EQ(info.transport_caps->max_inflight_buckets, 1u);
  ASSERT_NE(plugin->transport(), nullptr);
  EXPECT_EQ(plugin->model(), nullptr);
  EXPECT_EQ(plugin->transport()->put, nullptr);
  EXPECT_NE(plugin->transport()->send_bucket, nullptr);
}

TEST(RegistryAccepts, MockModelIsListedWithoutCapabilities) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_model(), dir);
  Registry reg({dir});
  const auto plugin = reg.model("mock");
  EXPECT_EQ(plugin->info().kind, FERRY_PLUGIN_MODEL);
  EXPECT_FALSE(plugin->info().transport_caps.has_value());
  EXPECT_EQ(plugin->transport(), nullptr);
  ASSERT_NE(plugin->model(), nullptr);
  EXPECT_NE(plugin->model()->locate, nullptr);
}

TEST(RegistryAccepts, TransportAndModelOfTheSameNameCoexist) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  ferry::testing::copy_plugin(ferry::testing::mock_model(), dir);
  Registry reg({dir});
  EXPECT_EQ(reg.plugins().size(), 2u);
  EXPECT_TRUE(reg.refused().empty());
  EXPECT_EQ(reg.transport("mock")->info().kind, FERRY_PLUGIN_TRANSPORT);
  EXPECT_EQ(reg.model("mock")->info().kind, FERRY_PLUGIN_MODEL);
}

TEST(RegistryLookup, MissingPluginErrorNamesFoldersAvailablePluginsAndRefusal) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  ferry::testing::copy_plugin(ferry::testing::broken("alpha"), dir);
  Registry reg({dir});
  try {
    reg.transport("alpha");
    FAIL() << "found a refused plugin";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
    EXPECT_THAT(
        e.what(),
        HasSubstr("no transport plugin 'alpha' (libferry_transport_alpha.so) in " + dir.string()));
    EXPECT_THAT(e.what(), HasSubstr("available: mock"));
    EXPECT_THAT(e.what(), HasSubstr("reports name 'beta'"));
  }
  EXPECT_THROW(reg.model("mock"), Error);
}

TEST(RegistryAccepts, PluginStaysUsableAfterTheRegistryIsGone) {
  std::shared_ptr<LoadedPlugin> plugin;
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  {
    Registry reg({dir});
    plugin = reg.transport("mock");
  }
  ferry_transport_caps_t caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(plugin->transport()->get_caps(&caps), nullptr);
  EXPECT_EQ(caps.flags, static_cast<std::uint32_t>(FERRY_TRANSPORT_CAP_POINT_TO_POINT));
}

// A bucket sent by one instance arrives in another, through the registry's copy of the table.
TEST(RegistryAccepts, MockTransportMovesABucketBetweenInstances) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  Registry reg({dir});
  const ferry_transport_api_t& api = *reg.transport("mock")->transport();

  auto create = [&](ferry_role_t role, const char* channel) {
    const ferry_option_t option{"channel", channel};
    ferry_transport_create_args_t args{};
    args.struct_size = sizeof args;
    args.role = role;
    args.options = &option;
    args.num_options = 1;
    args.device = -1;
    ferry_transport_t* t = nullptr;
    throw_if_error(api.create(&args, &t), "create");
    return t;
  };
  ferry_transport_t* receiver = create(FERRY_ROLE_RECEIVER, "registry-test");
  ferry_transport_t* sender = create(FERRY_ROLE_SENDER, "unused");

  ferry_blob_t address{};
  throw_if_error(api.get_address(receiver, &address), "get_address");
  ferry_connect_args_t connect{};
  connect.struct_size = sizeof connect;
  connect.remote_addresses = &address;
  connect.num_remote = 1;
  connect.group_size = 2;
  connect.peer_name = "receiver";
  ferry_peer_t* to_receiver = nullptr;
  throw_if_error(api.connect(sender, &connect, &to_receiver), "connect");
  ferry_peer_t* to_sender = nullptr;
  throw_if_error(api.connect(receiver, &connect, &to_sender), "connect");
  address.release(address.data, address.release_ctx);

  std::vector<std::uint8_t> out{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::uint8_t> in(8, 0);
  auto reg_memory = [&](ferry_transport_t* t, std::vector<std::uint8_t>& bytes) {
    ferry_memory_desc_t desc{};
    desc.struct_size = sizeof desc;
    desc.base = bytes.data();
    desc.size = bytes.size();
    desc.kind = FERRY_MEMORY_HOST;
    ferry_memory_t* m = nullptr;
    throw_if_error(api.register_memory(t, &desc, &m), "register_memory");
    return m;
  };
  ferry_memory_t* out_memory = reg_memory(sender, out);
  ferry_memory_t* in_memory = reg_memory(receiver, in);

  ferry_bucket_io_t send{};
  send.struct_size = sizeof send;
  send.data = {sizeof(ferry_memory_range_t), out_memory, 0, 8};
  ferry_request_t* request = nullptr;
  throw_if_error(api.send_bucket(sender, to_receiver, &send, &request), "send_bucket");
  EXPECT_EQ(request, nullptr);
  ferry_bucket_io_t recv{};
  recv.struct_size = sizeof recv;
  recv.data = {sizeof(ferry_memory_range_t), in_memory, 0, 8};
  throw_if_error(api.recv_bucket(receiver, to_sender, &recv, &request), "recv_bucket");
  EXPECT_EQ(in, out);

  api.deregister_memory(sender, out_memory);
  api.deregister_memory(receiver, in_memory);
  api.disconnect(sender, to_receiver);
  api.disconnect(receiver, to_sender);
  api.destroy(sender);
  api.destroy(receiver);
}

TEST(RegistryAccepts, MockModelPlansOneCopyPerTensor) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_model(), dir);
  Registry reg({dir});
  const ferry_model_api_t& api = *reg.model("mock")->model();
  ferry_model_create_args_t args{};
  args.struct_size = sizeof args;
  args.layout = "hf";
  args.tp_size = 1;
  args.ep_size = 1;
  ferry_model_t* model = nullptr;
  throw_if_error(api.create(&args, &model), "create");
  ferry_tensor_desc_t tensors[2] = {
      {sizeof(ferry_tensor_desc_t), "a.weight", FERRY_DTYPE_BF16, 2, {4, 8}},
      {sizeof(ferry_tensor_desc_t), "b.bias", FERRY_DTYPE_F32, 1, {8}},
  };
  ferry_layout_t* layout = nullptr;
  throw_if_error(api.target_layout(model, tensors, 2, &layout), "target_layout");
  ASSERT_EQ(layout->num_params, 2u);
  EXPECT_STREQ(layout->params[1].name, "b.bias");

  ferry_plan_t* plan = nullptr;
  throw_if_error(api.plan(model, &tensors[1], 1, &plan), "plan");
  ASSERT_EQ(plan->num_ops, 1u);
  EXPECT_EQ(plan->ops[0].dst_param, 1u);
  EXPECT_EQ(plan->ops[0].src_tensor, 0u);
  EXPECT_EQ(plan->ops[0].cols, 8u);
  EXPECT_EQ(plan->ops[0].rows, 1u);
  EXPECT_EQ(plan->ops[0].transform, FERRY_TRANSFORM_COPY);
  api.plan_free(model, plan);

  ferry_tensor_desc_t unknown = {sizeof(ferry_tensor_desc_t), "c.weight", FERRY_DTYPE_F32, 1, {8}};
  ErrorPtr error(api.plan(model, &unknown, 1, &plan));
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_NOT_FOUND);
  EXPECT_THAT(error_message(error.get()), HasSubstr("c.weight"));

  api.layout_free(model, layout);
  api.destroy(model);
}

// Functions of this test program stand in for a plugin's: they lie inside a loaded object.
ferry_error_t* fake_get_caps(ferry_transport_caps_t*) {
  return nullptr;
}
ferry_error_t* fake_create(const ferry_transport_create_args_t*, ferry_transport_t**) {
  return nullptr;
}
void fake_destroy(ferry_transport_t*) {}
ferry_error_t* fake_get_address(ferry_transport_t*, ferry_blob_t*) {
  return nullptr;
}

TEST(RegistryTables, FieldsPastTheTablesStructSizeReadAsNull) {
  ferry_transport_api_t table{};
  table.struct_size = kTransportRequiredSize;  // an old plugin: only the required functions
  table.get_caps = fake_get_caps;
  table.create = fake_create;
  table.destroy = fake_destroy;
  table.get_address = fake_get_address;  // lies past struct_size: must be ignored
  ferry_plugin_negotiation_t answer = host_negotiation(host_api_table());
  answer.api = &table;
  Tables copied;
  ASSERT_EQ(copy_tables(answer, FERRY_PLUGIN_TRANSPORT, &copied), std::nullopt);
  EXPECT_EQ(copied.plugin_struct_size, kTransportRequiredSize);
  EXPECT_EQ(copied.transport.struct_size, kTransportRequiredSize);
  EXPECT_EQ(copied.transport.create, fake_create);
  EXPECT_EQ(copied.transport.get_address, nullptr);
}

TEST(RegistryTables, FunctionPointingOutsideLoadedCodeIsRefused) {
  ferry_transport_api_t table{};
  table.struct_size = sizeof table;
  table.get_caps = fake_get_caps;
  table.create = fake_create;
  table.destroy = fake_destroy;
  table.abort = reinterpret_cast<void (*)(ferry_transport_t*, const char*)>(std::uintptr_t{0x40});
  ferry_plugin_negotiation_t answer = host_negotiation(host_api_table());
  answer.api = &table;
  Tables copied;
  const auto reason = copy_tables(answer, FERRY_PLUGIN_TRANSPORT, &copied);
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(*reason, HasSubstr("function 'abort' points outside every loaded object"));
}

TEST(RegistryVersion, MinorOlderThanTheHostMinimumIsRefused) {
  ferry_plugin_negotiation_t answer = host_negotiation(host_api_table());
  answer.plugin_abi_major = FERRY_PLUGIN_ABI_MAJOR;
  answer.plugin_abi_minor = 2;
  EXPECT_EQ(check_abi_version(answer, 2), std::nullopt);
  const auto reason = check_abi_version(answer, 3);
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(
      *reason,
      HasSubstr("implements plugin ABI 1.2, older than the oldest this host accepts (1.3)"));
}

}  // namespace
}  // namespace ferry::registry
