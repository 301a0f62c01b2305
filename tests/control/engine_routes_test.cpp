// tests/control/engine_routes_test.cpp: SGLang's engine routes against a real `ferry serve`,
// which runs no generation: pause/continue/flush answered from its state, the weight-update
// session's rules (begin twice, end without begin, draft selector, no release inside), the
// kv_cache tag never 404, /model_info, /server_info and /get_server_info fields,
// /weights_checker (checksum, snapshot, compare, reset_tensors), and the update fields ferry
// refuses with 400 naming them.
#include <gtest/gtest.h>

#include <memory>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

class EngineRoutes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(make_dense_checkpoint(
        DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 7));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 1);
    ServeOptions o;
    o.model_path = model_path();
    serve_ = std::make_unique<ServeProcess>(o);
  }
  static void TearDownTestSuite() {
    serve_.reset();
    checkpoint_.reset();
    dir_.reset();
  }
  static std::string model_path() { return (dir_->path() / "model").string(); }
  static Reply post(const std::string& path, const json& body = json::object()) {
    return serve_->post(path, body);
  }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TempDir> EngineRoutes::dir_;
std::unique_ptr<Checkpoint> EngineRoutes::checkpoint_;
std::unique_ptr<ServeProcess> EngineRoutes::serve_;

TEST_F(EngineRoutes, PauseContinueAndFlushAreAnsweredWithoutAnEngine) {
  Reply r = post("/pause_generation", json{{"mode", "in_place"}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["success"], true);
  EXPECT_EQ(r.body["status"], "ok");
  EXPECT_EQ(r.body["num_paused_requests"], 0);
  EXPECT_EQ(r.body["mode"], "in_place");
  Reply info = serve_->get("/server_info");
  ASSERT_EQ(info.status, 200) << info.text;
  EXPECT_EQ(info.body["ferry"]["engine"]["paused"], true);
  EXPECT_EQ(info.body["ferry"]["engine"]["pause_mode"], "in_place");
  EXPECT_EQ(info.body["ferry"]["engine"]["registered"], false);
  EXPECT_EQ(post("/pause_generation", json{{"mode", "sleep"}}).status, 400);
  r = post("/continue_generation", json{{"torch_empty_cache", false}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(serve_->get("/server_info").body["ferry"]["engine"]["paused"], false);
  EXPECT_EQ(serve_->get("/flush_cache").status, 200);
  r = post("/flush_cache");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_NE(r.body["message"].get<std::string>().find("no engine cache"), std::string::npos);
}

TEST_F(EngineRoutes, WeightUpdateSessionKeepsItsRules) {
  EXPECT_EQ(post("/end_weight_update").status, 409);
  Reply draft = post("/begin_weight_update", json{{"selector", "draft"}});
  EXPECT_EQ(draft.status, 400);
  EXPECT_NE(draft.body["message"].get<std::string>().find("no draft model"), std::string::npos);
  ASSERT_EQ(post("/begin_weight_update").status, 200);  // selector "all"
  EXPECT_EQ(post("/begin_weight_update", json{{"selector", "target"}}).status, 409);
  EXPECT_EQ(post("/release_memory_occupation", json{{"tags", {"weights"}}}).status, 409);
  Reply up = post("/update_weights_from_disk",
                  json{{"model_path", model_path()}, {"weight_version", "in-session"}});
  ASSERT_EQ(up.status, 200) << up.text;
  Reply end = post("/end_weight_update");
  ASSERT_EQ(end.status, 200) << end.text;
  EXPECT_EQ(end.body["num_updates"], 1);
  EXPECT_EQ(end.body["weight_version"], "in-session");
  EXPECT_EQ(post("/end_weight_update").status, 409);
}

TEST_F(EngineRoutes, KvCacheTagIsAcceptedAndReleasesNothing) {
  for (const char* path : {"/release_memory_occupation", "/resume_memory_occupation"}) {
    Reply r = post(path, json{{"tags", {"kv_cache"}}});
    ASSERT_EQ(r.status, 200) << path << ": " << r.text;
    EXPECT_EQ(r.body["not_held"], json({"kv_cache"}));
    for (const auto& tag : r.body["memory"]) EXPECT_EQ(tag["released"], false) << r.text;
  }
  EXPECT_EQ(serve_->get("/health").status, 200);
  EXPECT_EQ(post("/release_memory_occupation", json{{"tags", {"no_such_tag"}}}).status, 404);
}

TEST_F(EngineRoutes, ModelAndServerInfoCarrySglangFields) {
  Reply m = serve_->get("/model_info");
  ASSERT_EQ(m.status, 200) << m.text;
  EXPECT_EQ(m.body["model_path"], model_path());
  EXPECT_TRUE(m.body["weight_version"].is_string());
  EXPECT_GT(m.body["num_parameters"].get<int>(), 0);
  EXPECT_EQ(serve_->get("/get_model_info").body, m.body);
  Reply s = serve_->get("/server_info");
  ASSERT_EQ(s.status, 200) << s.text;
  EXPECT_EQ(s.body["tp_size"], 1);
  EXPECT_EQ(s.body["device"], "cpu");
  EXPECT_TRUE(s.body["version"].is_string());
  ASSERT_EQ(s.body["internal_states"].size(), 1u);
  EXPECT_EQ(s.body["internal_states"][0]["state"], "ready");
}

// SGLang's clients written before /server_info (and its own older servers) ask /get_server_info:
// the same answer, with the fields they read.
TEST_F(EngineRoutes, GetServerInfoAnswersAsServerInfo) {
  Reply old_name = serve_->get("/get_server_info");
  ASSERT_EQ(old_name.status, 200) << old_name.text;
  EXPECT_EQ(old_name.body["model_path"], model_path());
  EXPECT_EQ(old_name.body["tp_size"], 1);
  EXPECT_EQ(old_name.body["ep_size"], 1);
  EXPECT_TRUE(old_name.body["weight_version"].is_string()) << old_name.text;
  ASSERT_EQ(old_name.body["internal_states"].size(), 1u) << old_name.text;
  EXPECT_EQ(old_name.body["internal_states"][0]["tp_rank"], 0);
  EXPECT_EQ(old_name.body["internal_states"][0]["weight_version"], old_name.body["weight_version"]);
  EXPECT_EQ(old_name.body["ferry"]["engine"]["registered"], false);
  EXPECT_EQ(old_name.body, serve_->get("/server_info").body);
}

TEST_F(EngineRoutes, WeightsCheckerSnapshotResetCompare) {
  EXPECT_EQ(post("/weights_checker", json{{"action", "bogus"}}).status, 400);
  Reply sum = post("/weights_checker", json{{"action", "checksum"}});
  ASSERT_EQ(sum.status, 200) << sum.text;
  const json& rank = sum.body["ranks"][0];
  const auto prints = serve_->get("/get_fingerprints").body["fingerprints"];
  EXPECT_EQ(rank["checksums"], prints);
  EXPECT_EQ(rank["per_gpu_checksum"].get<std::string>().size(), 16u);
  EXPECT_EQ(rank["parallelism_info"]["tp_size"], 1);
  Reply skipped = post("/weights_checker", json{{"skip_tensor_list", {"layers"}}});
  ASSERT_EQ(skipped.status, 200) << skipped.text;
  EXPECT_LT(skipped.body["ranks"][0]["checksums"].size(), prints.size());
  EXPECT_NE(skipped.body["ranks"][0]["per_gpu_checksum"], rank["per_gpu_checksum"]);

  EXPECT_EQ(post("/weights_checker", json{{"action", "snapshot"}}).status, 200);
  EXPECT_EQ(post("/weights_checker", json{{"action", "compare"}}).status, 200);
  Reply reset = post("/weights_checker", json{{"action", "reset_tensors"}});
  ASSERT_EQ(reset.status, 200) << reset.text;
  EXPECT_EQ(reset.body["weight_version"], "weights_checker:reset_tensors");
  EXPECT_NE(serve_->get("/get_fingerprints").body["fingerprints"], prints);
  Reply differ = post("/weights_checker", json{{"action", "compare"}});
  EXPECT_EQ(differ.status, 409) << differ.text;
  EXPECT_NE(differ.body["message"].get<std::string>().find("differ from the snapshot"),
            std::string::npos);
  // The full update the reset was for restores every tensor: compare passes again.
  ASSERT_EQ(post("/update_weights_from_disk", json{{"model_path", model_path()}}).status, 200);
  Reply same = post("/weights_checker", json{{"action", "compare"}});
  EXPECT_EQ(same.status, 200) << same.text;
}

TEST_F(EngineRoutes, UpdateFieldsFerryCannotHonourAre400NamingThem) {
  Reply fmt =
      post("/update_weights_from_disk", json{{"model_path", model_path()}, {"load_format", "pt"}});
  EXPECT_EQ(fmt.status, 400);
  EXPECT_NE(fmt.text.find("load_format 'pt'"), std::string::npos) << fmt.text;
  Reply manifest = post("/update_weights_from_disk",
                        json{{"model_path", model_path()}, {"manifest", json::object()}});
  EXPECT_EQ(manifest.status, 400);
  EXPECT_NE(manifest.text.find("'manifest'"), std::string::npos) << manifest.text;
  Reply flag =
      post("/update_weights_from_disk", json{{"model_path", model_path()}, {"flush_cache", "yes"}});
  EXPECT_EQ(flag.status, 400);
  EXPECT_NE(flag.text.find("'flush_cache'"), std::string::npos) << flag.text;
  Reply bucket =
      post("/update_weights_from_distributed", json{{"names", {"a"}},
                                                    {"dtypes", {"float32"}},
                                                    {"shapes", {{2}}},
                                                    {"load_format", "npz"}});
  EXPECT_EQ(bucket.status, 400);
  EXPECT_NE(bucket.text.find("load_format 'npz'"), std::string::npos) << bucket.text;
  // What SGLang's clients send by default is accepted.
  Reply ok = post("/update_weights_from_disk", json{{"model_path", model_path()},
                                                    {"load_format", "auto"},
                                                    {"flush_cache", true},
                                                    {"abort_all_requests", false},
                                                    {"is_async", false},
                                                    {"torch_empty_cache", false},
                                                    {"keep_pause", false},
                                                    {"recapture_cuda_graph", false},
                                                    {"token_step", 0},
                                                    {"manifest", nullptr}});
  EXPECT_EQ(ok.status, 200) << ok.text;
  EXPECT_EQ(ok.body["num_paused_requests"], 0);
}

}  // namespace
}  // namespace ferry::test
