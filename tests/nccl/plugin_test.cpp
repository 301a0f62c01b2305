// tests/nccl/plugin_test.cpp: libferry_transport_nccl.so through its C table on any machine:
// it loads and negotiates without a GPU, declares broadcast + async on device memory, refuses
// unknown options, and refuses a machine without a GPU (or a device that does not exist) with a
// clear error object instead of crashing the host.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "load_plugin.hpp"

namespace ferry::nccl {
namespace {

TEST(NcclPlugin, DeclaresBroadcastOnDeviceMemory) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  ferry_transport_caps_t caps{};
  caps.struct_size = sizeof caps;
  ErrorPtr e(api->get_caps(&caps));
  ASSERT_FALSE(e) << error_message(e.get());
  EXPECT_EQ(caps.flags, FERRY_TRANSPORT_CAP_BROADCAST | FERRY_TRANSPORT_CAP_ASYNC);
  EXPECT_EQ(caps.memory_kinds, static_cast<std::uint32_t>(FERRY_MEMORY_CUDA));
  EXPECT_EQ(caps.max_inflight_buckets, 2u);
  EXPECT_NE(api->send_bucket, nullptr);
  EXPECT_NE(api->recv_bucket, nullptr);
  EXPECT_EQ(api->put, nullptr);
  EXPECT_EQ(api->source_open, nullptr);
}

TEST(NcclPlugin, RefusesUnknownOptions) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  ferry_option_t option{"nvls", "1"};
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_RECEIVER;
  args.options = &option;
  args.num_options = 1;
  ferry_transport_t* t = nullptr;
  ErrorPtr e(api->create(&args, &t));
  ASSERT_TRUE(e);
  EXPECT_EQ(error_code(e.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error_message(e.get()).find("unknown option 'nvls'"), std::string::npos);
  EXPECT_EQ(t, nullptr);
}

TEST(NcclPlugin, RefusesAMissingGpuWithAClearError) {
  const auto* api = test::load_nccl_plugin();
  ASSERT_NE(api, nullptr);
  int count = 0;
  const bool has_gpu = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_SENDER;
  args.device = has_gpu ? count : 0;  // with GPUs: one past the last
  ferry_transport_t* t = nullptr;
  ErrorPtr e(api->create(&args, &t));
  ASSERT_TRUE(e);
  EXPECT_EQ(t, nullptr);
  const std::string m = error_message(e.get());
  if (has_gpu) {
    EXPECT_EQ(error_code(e.get()), FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(m.find("CUDA device " + std::to_string(count) + " does not exist"),
              std::string::npos)
        << m;
  } else {
    EXPECT_EQ(error_code(e.get()), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(m.find("no CUDA device is usable"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace ferry::nccl
