// Malformed checkpoints POSTed to a real `ferry serve` (/update_weights_from_disk): one file per
// validation rule of plugins/disk/README.md, each refused with a JSON error that names the rule,
// and afterwards the receiver is healthy and serves the same version and the same weights.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write_bytes(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string le64(std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

// A safetensors file made by hand: the length prefix of `header`, `header`, then `data_bytes`
// non-zero bytes.
std::string raw_file(const std::string& header, std::size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (std::size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i * 7 + 1);
  return le64(header.size()) + header + data;
}

const std::string kTensorA = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

struct Malformed {
  std::string name;
  std::string rule;         // a substring the error message must contain
  int status;               // expected HTTP status
  std::string target;       // file or folder name posted, relative to the corpus folder
  std::function<void(const fs::path& dir)> make;  // writes the case under dir
};

// gtest prints the case by name rather than as bytes.
void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

std::vector<Malformed> corpus() {
  auto file = [](std::string header, std::size_t data) {
    return [header = std::move(header), data](const fs::path& dir) {
      write_bytes(dir / "model.safetensors", raw_file(header, data));
    };
  };
  std::vector<Malformed> cases;
  cases.push_back({"header_length_past_file", "runs past the end of the file", 400,
                   "model.safetensors", [](const fs::path& dir) {
                     write_bytes(dir / "model.safetensors", le64(1000) + "{}");
                   }});
  cases.push_back({"header_over_100mb_cap", "exceeds the limit of 100000000 bytes", 400,
                   "model.safetensors", [](const fs::path& dir) {
                     write_bytes(dir / "model.safetensors", le64(100'000'001) + "{}");
                   }});
  cases.push_back({"file_shorter_than_prefix", "shorter than the 8-byte header length prefix",
                   400, "model.safetensors",
                   [](const fs::path& dir) { write_bytes(dir / "model.safetensors", "abc"); }});
  cases.push_back({"header_not_json", "is not valid JSON", 400, "model.safetensors",
                   file("{\"a\": {\"dtype\": ", 8)});
  cases.push_back({"header_not_object", "header is not a JSON object", 400, "model.safetensors",
                   file("[1, 2, 3]", 0)});
  cases.push_back({"unknown_dtype", "unknown dtype 'F128'", 400, "model.safetensors",
                   file(R"({"a": {"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}})", 8)});
  cases.push_back({"begin_after_end", "have begin greater than end", 400, "model.safetensors",
                   file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)});
  cases.push_back({"span_not_shape_size", "span 8 bytes but shape [3] of F32 needs 12 bytes", 400,
                   "model.safetensors",
                   file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)});
  cases.push_back({"gap", "gap of 4 bytes after tensor 'a'", 400, "model.safetensors",
                   file("{" + kTensorA +
                            R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
                        20)});
  cases.push_back({"first_not_at_zero", "must start at offset 0", 400, "model.safetensors",
                   file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12)});
  cases.push_back({"overlap", "overlap tensor 'a'", 400, "model.safetensors",
                   file("{" + kTensorA +
                            R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        12)});
  cases.push_back({"last_end_not_data_size", "4 trailing bytes belong to no tensor", 400,
                   "model.safetensors", file("{" + kTensorA + "}", 12)});
  cases.push_back({"duplicate_name", "duplicate tensor name 'a'", 400, "model.safetensors",
                   file("{" + kTensorA + ", " + kTensorA + "}", 8)});
  cases.push_back({"metadata_not_strings", "__metadata__ must be an object of string to string",
                   400, "model.safetensors",
                   file(R"({"__metadata__": {"format": 1}, )" + kTensorA + "}", 8)});
  cases.push_back({"metadata_not_object", "__metadata__ must be an object of string to string",
                   400, "model.safetensors",
                   file(R"({"__metadata__": "pt", )" + kTensorA + "}", 8)});
  cases.push_back({"truncated_data", "run past the end of the data section", 400,
                   "model.safetensors", [](const fs::path& dir) {
                     const std::string whole = raw_file("{" + kTensorA + "}", 8);
                     write_bytes(dir / "model.safetensors", whole.substr(0, whole.size() - 3));
                   }});
  cases.push_back(
      {"shape_product_overflow", "overflows a 64-bit byte size", 400, "model.safetensors",
       file(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
            8)});
  cases.push_back({"index_names_missing_shard", "'model-00002-of-00002.safetensors' (listed for "
                                                "tensor 'b') does not exist",
                   404, ".", [](const fs::path& dir) {
                     write_bytes(dir / "model-00001-of-00002.safetensors",
                                 raw_file("{" + kTensorA + "}", 8));
                     write_bytes(dir / "model.safetensors.index.json",
                                 R"({"metadata": {"total_size": 16}, "weight_map": {)"
                                 R"("a": "model-00001-of-00002.safetensors", )"
                                 R"("b": "model-00002-of-00002.safetensors"}})");
                   }});
  // Two shards whose tensors the index swaps.
  auto swapped_index = [](const fs::path& dir, const std::string& a_in, const std::string& b_in) {
    write_bytes(dir / "model-00001-of-00002.safetensors", raw_file("{" + kTensorA + "}", 8));
    write_bytes(dir / "model-00002-of-00002.safetensors",
                raw_file(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8));
    write_bytes(dir / "model.safetensors.index.json",
                R"({"metadata": {"total_size": 16}, "weight_map": {"a": ")" + a_in +
                    R"(", "b": ")" + b_in + R"("}})");
  };
  cases.push_back({"index_names_wrong_shard",
                   "tensor 'a' is in this shard but the index", 400, ".",
                   [swapped_index](const fs::path& dir) {
                     swapped_index(dir, "model-00002-of-00002.safetensors",
                                   "model-00001-of-00002.safetensors");
                   }});
  cases.push_back({"index_shard_lacks_tensor",
                   "tensor 'a' is listed in shard 'model-00002-of-00002.safetensors' but that "
                   "shard does not contain it",
                   400, ".", [swapped_index](const fs::path& dir) {
                     swapped_index(dir, "model-00002-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors");
                   }});
  cases.push_back({"missing_path", "no such file or directory", 404, "does-not-exist",
                   [](const fs::path& dir) { fs::create_directories(dir); }});
  return cases;
}

// One receiver per test suite, loaded with a valid checkpoint (version 1).
class MalformedBase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    DenseShape shape;
    checkpoint_ = std::make_unique<Checkpoint>(
        make_dense_checkpoint(shape, [](const std::string&) { return FERRY_DTYPE_BF16; }, 11));
    write_checkpoint(dir_->path() / "model", *checkpoint_, 2);
    ServeOptions o;
    o.model_path = (dir_->path() / "model").string();
    serve_ = std::make_unique<ServeProcess>(o);
    prints_ = std::make_unique<std::map<std::string, std::string>>(serve_->fingerprints());
  }
  static void TearDownTestSuite() {
    serve_.reset();
    prints_.reset();
    checkpoint_.reset();
    dir_.reset();
  }

  // The receiver still serves version 1 with the weights it had before.
  static void expect_unchanged() {
    const Reply health = serve_->get("/health");
    EXPECT_EQ(health.status, 200) << health.text;
    EXPECT_EQ(health.body.value("state", ""), "ready");
    const Reply version = serve_->get("/get_weight_version");
    ASSERT_EQ(version.status, 200);
    EXPECT_EQ(version.body["version"].get<std::uint64_t>(), 1u);
    EXPECT_EQ(version.body["weight_version"].get<std::string>(), "1");
    EXPECT_EQ(serve_->fingerprints(), *prints_);
  }

  static std::unique_ptr<TempDir> dir_;
  static std::unique_ptr<Checkpoint> checkpoint_;
  static std::unique_ptr<ServeProcess> serve_;
  static std::unique_ptr<std::map<std::string, std::string>> prints_;
};
std::unique_ptr<TempDir> MalformedBase::dir_;
std::unique_ptr<Checkpoint> MalformedBase::checkpoint_;
std::unique_ptr<ServeProcess> MalformedBase::serve_;
std::unique_ptr<std::map<std::string, std::string>> MalformedBase::prints_;

class ServeMalformed : public MalformedBase, public ::testing::WithParamInterface<Malformed> {};
class ServeRefusal : public MalformedBase {};

TEST_P(ServeMalformed, IsRefusedNamingTheRuleAndChangesNothing) {
  const Malformed& m = GetParam();
  const fs::path dir = dir_->path() / "corpus" / m.name;
  m.make(dir);
  const fs::path target = m.target == "." ? dir : dir / m.target;

  const Reply reply = serve_->update_from_disk(target.string());
  EXPECT_EQ(reply.status, m.status) << reply.text;
  ASSERT_TRUE(reply.body.is_object()) << reply.text;
  EXPECT_EQ(reply.body.value("success", true), false);
  const std::string message = reply.body.value("message", "");
  EXPECT_NE(message.find(m.rule), std::string::npos)
      << "message '" << message << "' does not name the rule '" << m.rule << "'";
  expect_unchanged();
}

INSTANTIATE_TEST_SUITE_P(Corpus, ServeMalformed, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<Malformed>& info) {
                           return info.param.name;
                         });

// A well-formed checkpoint of another model is refused before anything is written.
TEST_F(ServeRefusal, CheckpointOfAnotherShapeIsRefusedBeforeWriting) {
  DenseShape other;
  other.hidden = 16;
  const Checkpoint c =
      make_dense_checkpoint(other, [](const std::string&) { return FERRY_DTYPE_BF16; }, 12);
  write_checkpoint(dir_->path() / "other", c, 1);
  const Reply reply = serve_->update_from_disk((dir_->path() / "other").string());
  EXPECT_EQ(reply.status, 400) << reply.text;
  EXPECT_NE(reply.body.value("message", "").find("but the layout expects"), std::string::npos)
      << reply.text;
  expect_unchanged();
}

// After refusals the receiver still accepts a good update.
TEST_F(ServeRefusal, GoodUpdateAfterRefusalsCommits) {
  const Reply bad = serve_->update_from_disk((dir_->path() / "no-such-model").string());
  EXPECT_EQ(bad.status, 404) << bad.text;
  const Reply reply = serve_->update_from_disk((dir_->path() / "model").string());
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body.value("success", false), true);
  EXPECT_EQ(reply.body["version"].get<std::uint64_t>(), 2u);
  EXPECT_EQ(reply.body["weight_version"].get<std::string>(), "2");
  EXPECT_EQ(serve_->fingerprints(), *prints_);  // same checkpoint, same bytes
  const Reply version = serve_->get("/get_weight_version");
  EXPECT_EQ(version.body["version"].get<std::uint64_t>(), 2u);
}

}  // namespace
}  // namespace ferry::test
