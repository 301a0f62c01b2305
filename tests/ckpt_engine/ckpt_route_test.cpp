// POST /update_weights_from_ipc on a real `ferry serve` process without a GPU: malformed fields
// are 400 naming the field, and a well-formed request is refused with a clear error (409) before
// any ParameterServer is contacted, leaving the receiver ready at its version.
#include <gtest/gtest.h>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

class CkptEngineRoute : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServeOptions options;
    options.model_family = "dense";
    serve_ = new ServeProcess(options);
  }
  static void TearDownTestSuite() {
    delete serve_;
    serve_ = nullptr;
  }
  static ServeProcess* serve_;
};
ServeProcess* CkptEngineRoute::serve_ = nullptr;

void expect_refused(const Reply& r, int status, const std::string& named) {
  EXPECT_EQ(r.status, status) << r.text;
  EXPECT_EQ(r.body.value("success", true), false) << r.text;
  EXPECT_NE(r.body.value("message", std::string()).find(named), std::string::npos) << r.text;
}

TEST_F(CkptEngineRoute, MalformedFieldsAre400NamingTheField) {
  const std::string route = "/update_weights_from_ipc";
  expect_refused(serve_->post(route, json::object()), 400, "'zmq_handles' is required");
  expect_refused(serve_->post(route, json{{"zmq_handles", json::array({"ipc://@x"})}}), 400,
                 "'zmq_handles' must be a non-empty object");
  expect_refused(serve_->post(route, json{{"zmq_handles", json::object()}}), 400,
                 "'zmq_handles' must be a non-empty object");
  expect_refused(serve_->post(route, json{{"zmq_handles", {{"GPU-1", 5}}}}), 400,
                 "zmq_handles['GPU-1']");
  const json handles = {{"GPU-1", "ipc://@checkpoint-engine-GPU-1-0.sock"}};
  expect_refused(serve_->post(route, json{{"zmq_handles", handles}, {"flush_cache", "yes"}}), 400,
                 "'flush_cache' must be a boolean");
  expect_refused(serve_->post(route, json{{"zmq_handles", handles}, {"weight_version", {1}}}),
                 400, "'weight_version' must be a string");
  expect_refused(serve_->post(route, json{{"zmq_handles", handles}, {"timeout_s", -1}}), 400,
                 "'timeout_s'");
  expect_refused(serve_->post_raw(route, "{\"zmq_handles\": "), 400, "not valid JSON");
}

TEST_F(CkptEngineRoute, CpuReceiverRefusesClearlyAndKeepsItsVersion) {
  const auto before = serve_->get("/get_weight_version");
  const json body = {{"zmq_handles", {{"GPU-0a1b2c3d-0000-1111-2222-333344445555",
                                       "ipc://@checkpoint-engine-GPU-x-0.sock"}}},
                     {"weight_version", "step-1"},
                     {"flush_cache", true}};
  const Reply r = serve_->post("/update_weights_from_ipc", body, serve_->auth());
  expect_refused(r, 409, "needs a CUDA receiver");
  EXPECT_EQ(r.body.value("code", std::string()), "FAILED_PRECONDITION") << r.text;
  const auto after = serve_->get("/get_weight_version");
  EXPECT_EQ(after.body, before.body);
}

}  // namespace
}  // namespace ferry::test
