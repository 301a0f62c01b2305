// The HTTP control API of a real `ferry serve`: every route of ferry::control::routes() is
// checked for its authentication (mutating routes need the token, read-only ones never do) and
// against docs/http-api.md (method, source, mutating flag, and no row for a route not served);
// JSON errors for bad requests and unknown routes; metrics after an update; a clean exit on
// SIGTERM.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "control/http_server.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

using nlohmann::json;

constexpr const char* kToken = "s3cret-token";

// One whole line of Prometheus text: "\n<name> <value>\n".
std::string fmt_line(const std::string& name, std::uint64_t value) {
  return "\n" + name + " " + std::to_string(value) + "\n";
}

class ControlApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    checkpoint_ = std::make_unique<Checkpoint>(
        make_dense_checkpoint(DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F32; }, 5));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 1);
    ServeOptions o;
    o.model_path = model_path();
    o.token = kToken;
    serve_ = std::make_unique<ServeProcess>(o);
  }
  static void TearDownTestSuite() {
    serve_.reset();
    checkpoint_.reset();
    dir_.reset();
  }
  static std::string model_path() { return (dir_->path() / "model").string(); }

  // A request body that the route accepts (so that "with the token" reaches the handler).
  static json valid_body(const std::string& path) {
    if (path == "/update_weights_from_disk") return json{{"model_path", model_path()}};
    if (path == "/get_weights_by_name") return json{{"name", "model.norm.weight"}, {"truncate_size", 2}};
    if (path == "/update_weight_version") return json{{"new_version", "label-from-route-test"}};
    return json::object();
  }

  static Reply call(const control::Route& route, const httplib::Headers& headers) {
    if (std::string(route.method) == "GET") return serve_->get(route.path, headers);
    return serve_->post(route.path, valid_body(route.path), headers);
  }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
  static std::unique_ptr<ServeProcess> serve_;
};
std::unique_ptr<TempDir> ControlApi::dir_;
std::unique_ptr<Checkpoint> ControlApi::checkpoint_;
std::unique_ptr<ServeProcess> ControlApi::serve_;

TEST_F(ControlApi, MutatingRoutesNeedTheTokenAndReadOnlyRoutesNever) {
  const auto& routes = control::routes();
  ASSERT_GE(routes.size(), 10u);
  const httplib::Headers good = {{"Authorization", std::string("Bearer ") + kToken}};
  const httplib::Headers wrong = {{"Authorization", "Bearer s3cret-tokem"}};
  const httplib::Headers shorter = {{"Authorization", "Bearer s3cret"}};
  const httplib::Headers no_scheme = {{"Authorization", kToken}};
  std::size_t mutating = 0;
  for (const auto& route : routes) {
    SCOPED_TRACE(std::string(route.method) + " " + route.path);
    if (route.mutating) {
      ++mutating;
      for (const auto& headers : {httplib::Headers{}, wrong, shorter, no_scheme}) {
        const Reply denied = call(route, headers);
        EXPECT_EQ(denied.status, 401) << denied.text;
        EXPECT_EQ(denied.body.value("success", true), false) << denied.text;
        EXPECT_NE(denied.body.value("message", "").find("Authorization: Bearer"),
                  std::string::npos)
            << denied.text;
      }
      const Reply allowed = call(route, good);
      EXPECT_NE(allowed.status, 401) << allowed.text;
      const std::string path = route.path;
      if (path == "/init_weights_update_group" || path == "/update_weights_from_distributed" ||
          path == "/destroy_weights_update_group" || path == "/update_weights_from_ipc" ||
          path == "/update_weights_from_tensor" || path == "/init_weight_transfer_engine" ||
          path == "/update_weights" || path == "/weight_checker") {
        // An empty body lacks the group's required fields (400) or names no group (404);
        // tests/nccl covers these routes with real requests (tests/ckpt_engine the IPC one,
        // python/tests/test_update_from_tensor.py the tensor one, control_vllm_routes vLLM's).
        EXPECT_TRUE(allowed.status == 400 || allowed.status == 404) << allowed.text;
      } else {
        EXPECT_EQ(allowed.status, 200) << allowed.text;
      }
    } else {
      for (const auto& headers : {httplib::Headers{}, wrong}) {
        const Reply open = call(route, headers);
        EXPECT_NE(open.status, 401) << open.text;
        EXPECT_NE(open.status, 0) << "no answer";
      }
    }
  }
  EXPECT_GE(mutating, 4u);  // update from disk, version label, release, resume
  // Every mutating call with the token succeeded in order (release then resume): healthy.
  EXPECT_EQ(serve_->get("/health").status, 200);
}

TEST_F(ControlApi, DocumentationListsEveryRouteWithItsMethodAndMutatingFlag) {
  std::ifstream in(required_env("FERRY_HTTP_API_DOC"));
  ASSERT_TRUE(in) << "cannot read docs/http-api.md";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (const auto& route : control::routes()) {
    SCOPED_TRACE(route.path);
    // Whose route it is: one of the sources the document explains.
    const std::string source = route.source;
    EXPECT_TRUE(source == "SGLang" || source == "vLLM" || source == "SGLang, vLLM" ||
                source == "ferry")
        << source;
    const std::string cell = std::string("`") + route.path + "`";
    const std::string* row = nullptr;
    for (const auto& line : lines) {
      // The row whose second cell (the path) is this route's.
      const auto first = line.find(" | ");
      if (line.starts_with("|") && first != std::string::npos &&
          line.compare(first + 3, cell.size() + 2, cell + " |") == 0) {
        row = &line;
      }
    }
    ASSERT_NE(row, nullptr) << "docs/http-api.md has no table row for " << route.path;
    EXPECT_TRUE(row->starts_with(std::string("| ") + route.method + " | " + cell + " | " +
                                 route.source + " | " + (route.mutating ? "yes" : "no") + " |"))
        << *row;
  }
  // And the other way: every route the table lists is served (no row for a route that is not).
  std::size_t rows = 0;
  for (const auto& line : lines) {
    const auto open = line.find("| `/");
    if (!line.starts_with("| GET") && !line.starts_with("| POST")) continue;
    if (open == std::string::npos) continue;
    const auto close = line.find('`', open + 3);
    const std::string path = line.substr(open + 3, close - open - 3);
    ++rows;
    const bool served = std::any_of(control::routes().begin(), control::routes().end(),
                                    [&](const control::Route& r) { return path == r.path; });
    EXPECT_TRUE(served) << "docs/http-api.md lists " << path << ", which the server does not serve";
  }
  EXPECT_EQ(rows, control::routes().size());
}

TEST_F(ControlApi, MalformedJsonBodyIs400WithAMessage) {
  const Reply read_only = serve_->post_raw("/get_weights_by_name", "{\"name\": ");
  EXPECT_EQ(read_only.status, 400) << read_only.text;
  EXPECT_EQ(read_only.body.value("success", true), false);
  EXPECT_NE(read_only.body.value("message", "").find("not valid JSON"), std::string::npos)
      << read_only.text;
  EXPECT_EQ(read_only.body.value("code", ""), "INVALID_ARGUMENT");

  const Reply mutating =
      serve_->post_raw("/update_weights_from_disk", "model_path=/x", serve_->auth());
  EXPECT_EQ(mutating.status, 400) << mutating.text;
  EXPECT_NE(mutating.body.value("message", "").find("not valid JSON"), std::string::npos)
      << mutating.text;

  const Reply array = serve_->post_raw("/release_memory_occupation", "[1, 2]", serve_->auth());
  EXPECT_EQ(array.status, 400) << array.text;
  EXPECT_NE(array.body.value("message", "").find("must be a JSON object"), std::string::npos)
      << array.text;
  EXPECT_EQ(serve_->get("/health").status, 200);  // nothing was released
}

TEST_F(ControlApi, UnknownRouteIs404Json) {
  const Reply get = serve_->get("/no_such_route");
  EXPECT_EQ(get.status, 404) << get.text;
  ASSERT_TRUE(get.body.is_object()) << get.text;
  EXPECT_EQ(get.body.value("success", true), false);
  EXPECT_NE(get.body.value("message", "").find("/no_such_route"), std::string::npos) << get.text;

  const Reply post = serve_->post("/update_weights_from_network", json::object(), serve_->auth());
  EXPECT_EQ(post.status, 404) << post.text;
  EXPECT_TRUE(post.body.is_object()) << post.text;
}

TEST_F(ControlApi, MissingOrMistypedFieldIs400NamingTheField) {
  struct Bad {
    const char* path;
    json body;
    const char* field;
  };
  const std::vector<Bad> cases = {
      {"/get_weights_by_name", json::object(), "'name'"},
      {"/get_weights_by_name", json{{"name", 3}}, "'name'"},
      {"/get_weights_by_name", json{{"name", "model.norm.weight"}, {"truncate_size", "ten"}},
       "'truncate_size'"},
      {"/get_weights_by_name", json{{"name", "model.norm.weight"}, {"truncate_size", -1}},
       "truncate_size"},
      // Integer fields take integers: 3.7 is not read as 3.
      {"/get_weights_by_name", json{{"name", "model.norm.weight"}, {"truncate_size", 3.7}},
       "'truncate_size' must be an integer"},
      {"/get_weights_by_name", json{{"name", "model.norm.weight"}, {"truncate_size", 1e30}},
       "'truncate_size' must be an integer"},
      {"/get_weights_by_name", json{{"name", "model.norm.weight"}, {"truncate_size", true}},
       "'truncate_size' must be an integer"},
      {"/update_weights_from_disk", json::object(), "'model_path'"},
      {"/update_weights_from_disk", json{{"model_path", ""}}, "'model_path'"},
      {"/update_weight_version", json::object(), "'new_version'"},
      {"/update_weight_version", json{{"new_version", {1, 2}}}, "'new_version'"},
      {"/release_memory_occupation", json{{"tags", "weights"}}, "'tags'"},
      {"/resume_memory_occupation", json{{"tags", {1}}}, "'tags'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.path) + " " + c.body.dump());
    const Reply r = serve_->post(c.path, c.body, serve_->auth());
    EXPECT_EQ(r.status, 400) << r.text;
    EXPECT_EQ(r.body.value("success", true), false) << r.text;
    EXPECT_NE(r.body.value("message", "").find(c.field), std::string::npos) << r.text;
  }
  const Reply unknown = serve_->post("/get_weights_by_name", json{{"name", "model.nope.weight"}});
  EXPECT_EQ(unknown.status, 404) << unknown.text;
  EXPECT_NE(unknown.body.value("message", "").find("model.nope.weight"), std::string::npos);
  EXPECT_EQ(serve_->get("/health").status, 200);
}

TEST_F(ControlApi, MetricsCountCommittedUpdatesAndTheVersion) {
  const Reply before = serve_->get("/get_weight_version");
  ASSERT_EQ(before.status, 200);
  const std::uint64_t v = before.body["version"].get<std::uint64_t>();

  const Reply update = serve_->post("/update_weights_from_disk",
                                    json{{"model_path", model_path()}, {"weight_version", "step-9"}},
                                    serve_->auth());
  ASSERT_EQ(update.status, 200) << update.text;
  EXPECT_EQ(update.body["version"].get<std::uint64_t>(), v + 1);
  EXPECT_EQ(update.body["weight_version"].get<std::string>(), "step-9");
  EXPECT_EQ(update.body["tensors"].get<std::uint64_t>(), checkpoint_->tensors.size());
  // Bucket bytes moved: every tensor byte, plus the alignment padding between tensors.
  EXPECT_GE(update.body["bytes"].get<std::uint64_t>(), checkpoint_->total_bytes());
  EXPECT_GE(update.body["buckets"].get<std::uint64_t>(), 1u);

  const Reply metrics = serve_->get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  const std::string text = metrics.text;
  // Every committed update is counted: the initial load and each update since (v + 1 in all).
  EXPECT_NE(text.find(fmt_line("ferry_weight_version{label=\"step-9\"}", v + 1)), std::string::npos)
      << text;
  EXPECT_NE(text.find(fmt_line("ferry_updates_committed_total", v + 1)), std::string::npos) << text;
  EXPECT_NE(text.find("\nferry_ready 1\n"), std::string::npos) << text;

  const Reply relabel =
      serve_->post("/update_weight_version", json{{"new_version", "step-10"}}, serve_->auth());
  ASSERT_EQ(relabel.status, 200) << relabel.text;
  const Reply version = serve_->get("/get_weight_version");
  EXPECT_EQ(version.body["weight_version"].get<std::string>(), "step-10");
  EXPECT_EQ(version.body["version"].get<std::uint64_t>(), v + 1);  // a label is not a commit
  const std::string relabelled = serve_->get("/metrics").text;
  EXPECT_NE(relabelled.find(fmt_line("ferry_weight_version{label=\"step-10\"}", v + 1)),
            std::string::npos)
      << relabelled;
  EXPECT_NE(relabelled.find(fmt_line("ferry_updates_committed_total", v + 1)), std::string::npos);
}

TEST(ControlProcess, WithoutTokenMutatingRoutesAreOpenAndSigtermExitsZero) {
  TempDir dir;
  const Checkpoint c =
      make_dense_checkpoint(DenseShape{}, [](const std::string&) { return FERRY_DTYPE_F16; }, 9);
  write_checkpoint(dir.path() / "model", c, 1);

  ServeOptions empty;  // no weights yet
  ServeProcess serve(empty);
  const Reply health = serve.get("/health");
  EXPECT_EQ(health.status, 503) << health.text;
  EXPECT_EQ(health.body.value("state", ""), "empty");
  const Reply first = serve.update_from_disk((dir.path() / "model").string());
  ASSERT_EQ(first.status, 200) << first.text;
  EXPECT_EQ(first.body["version"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(serve.get("/health").status, 200);
  const Reply release = serve.post("/release_memory_occupation", json::object());
  EXPECT_EQ(release.status, 200) << release.text;

  const auto code = serve.terminate(10);
  ASSERT_TRUE(code.has_value()) << "ferry serve did not exit on SIGTERM within 10 s: "
                                << serve.log();
  EXPECT_EQ(*code, 0) << serve.log();
}

}  // namespace
}  // namespace ferry::test
