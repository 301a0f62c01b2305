// tests/nccl/routes_test.cpp: the three weight-update group routes of a real `ferry serve` on any
// machine: a join that cannot succeed fails with a clear error and the right status (no NCCL in
// the build: 501; no GPU: 409 naming it; a GPU but no rank 0: 504 naming the phase), malformed
// fields are 400 naming the field, an unknown group is 404, and the server stays up throughout.
#include <gtest/gtest.h>

#include <string>

#include "ferry_build_config.h"
#include "serve_fixture.hpp"
#if FERRY_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ferry::test {
namespace {

using nlohmann::json;

bool has_gpu() {
#if FERRY_HAVE_NCCL
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

class GroupRoutes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServeOptions o;
    o.model_family = "identity";
    serve_ = std::make_unique<ServeProcess>(o);
  }
  static void TearDownTestSuite() { serve_.reset(); }
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<ServeProcess> GroupRoutes::serve_;

TEST_F(GroupRoutes, AJoinThatCannotSucceedFailsClearly) {
  // Nobody serves the rendezvous on port 1 of the loopback.
  const Reply r = serve_->post("/init_weights_update_group",
                               json{{"master_address", "127.0.0.1"}, {"master_port", 1},
                                    {"rank_offset", 1}, {"world_size", 2}, {"group_name", "g"},
                                    {"backend", "nccl"}, {"timeout_s", 1}});
  EXPECT_EQ(r.body.value("success", true), false) << r.text;
  const std::string message = r.body.value("message", "");
  if (!FERRY_HAVE_NCCL) {
    EXPECT_EQ(r.status, 501) << r.text;
    EXPECT_NE(message.find("built without NCCL"), std::string::npos) << r.text;
  } else if (!has_gpu()) {
    EXPECT_EQ(r.status, 409) << r.text;
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << r.text;
  } else {
    EXPECT_EQ(r.status, 504) << r.text;
    EXPECT_NE(message.find("phase 'connect to rank 0'"), std::string::npos) << r.text;
  }
  EXPECT_EQ(serve_->get("/get_weight_version").status, 200);
}

TEST_F(GroupRoutes, MalformedFieldsAre400NamingTheField) {
  const Reply bad_dtype = serve_->post(
      "/update_weights_from_distributed",
      json{{"names", {"w"}}, {"dtypes", {"float128"}}, {"shapes", {{4}}}, {"group_name", "g"}});
  EXPECT_EQ(bad_dtype.status, 400) << bad_dtype.text;
  EXPECT_NE(bad_dtype.body.value("message", "").find("unknown dtype 'float128'"),
            std::string::npos)
      << bad_dtype.text;
  const Reply bad_port = serve_->post(
      "/init_weights_update_group",
      json{{"master_address", "h"}, {"master_port", 99999}, {"rank_offset", 1}, {"world_size", 2}});
  EXPECT_EQ(bad_port.status, 400) << bad_port.text;
  EXPECT_NE(bad_port.body.value("message", "").find("'master_port'"), std::string::npos)
      << bad_port.text;
  const Reply no_names = serve_->post("/update_weights_from_distributed", json::object());
  EXPECT_EQ(no_names.status, 400) << no_names.text;
  EXPECT_NE(no_names.body.value("message", "").find("'names' is required"), std::string::npos)
      << no_names.text;
}

TEST_F(GroupRoutes, AnUnknownGroupIsNotFound) {
  const Reply update = serve_->post(
      "/update_weights_from_distributed",
      json{{"names", {"w"}}, {"dtypes", {"F32"}}, {"shapes", {{4}}}, {"group_name", "nope"}});
  const Reply destroy = serve_->post("/destroy_weights_update_group", json{{"group_name", "nope"}});
  // In every build: groups of either backend live in the same table (a build without NCCL can
  // still join a torch trainer's gloo group).
  EXPECT_EQ(update.status, 404) << update.text;
  EXPECT_NE(update.body.value("message", "").find("no weight-update group 'nope'"),
            std::string::npos)
      << update.text;
  EXPECT_EQ(destroy.status, 404) << destroy.text;
  EXPECT_EQ(serve_->get("/get_weight_version").status, 200);
}

}  // namespace
}  // namespace ferry::test
