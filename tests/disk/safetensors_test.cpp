// tests/disk/safetensors_test.cpp: the safetensors reader accepts what the writer produces and
// rejects each malformed file with an error naming the file, the tensor and the broken rule.
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <ferry/formats/safetensors.hpp>
#include "temp_dir.hpp"

namespace ferry::safetensors {
namespace {

using test::pattern_bytes;
using test::TempDir;
using test::write_raw;

// Runs `body`, which must throw ferry::Error with `code` and a message containing each of
// `parts`. Returns the message.
std::string expect_error(const std::function<void()>& body, ferry_status_code_t code,
                         const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << part;
    return e.what();
  }
  ADD_FAILURE() << "no ferry::Error thrown; expected one containing " << parts.front();
  return {};
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes a raw file named "bad.safetensors" and expects read_checkpoint to reject it with
  // CORRUPT_DATA, naming the file and `rule`.
  void expect_corrupt(const std::string& header, std::size_t data_bytes,
                      const std::vector<std::string>& rule) {
    const std::string path = dir_.file("bad.safetensors");
    write_raw(path, header, data_bytes);
    std::vector<std::string> parts = rule;
    parts.push_back(path);
    expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA, parts);
  }

  TempDir dir_;
};

TEST_F(SafetensorsTest, WriterRoundTripPreservesTensorsBytesAndMetadata) {
  const auto a = pattern_bytes(2 * 3 * 4, 1);
  const auto b = pattern_bytes(5 * 2, 2);
  const auto c = pattern_bytes(1, 3);
  const std::vector<TensorData> tensors = {
      {"layer.0.weight", FERRY_DTYPE_F32, {2, 3}, a},
      {"layer.0.bias", FERRY_DTYPE_BF16, {5}, b},
      {"flag", FERRY_DTYPE_BOOL, {}, c},
  };
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});

  File file = read_file(path, /*keep_open=*/true);
  EXPECT_EQ(file.header_bytes % 8, 0u);
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  ASSERT_EQ(file.tensors.size(), 3u);
  // Sorted by offset, which is the order written.
  EXPECT_EQ(file.tensors[0].name, "layer.0.weight");
  EXPECT_EQ(file.tensors[0].dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(file.tensors[0].shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(file.tensors[0].begin, 0u);
  EXPECT_EQ(file.tensors[0].end, 24u);
  EXPECT_EQ(file.tensors[1].name, "layer.0.bias");
  EXPECT_EQ(file.tensors[1].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(file.tensors[2].name, "flag");
  EXPECT_TRUE(file.tensors[2].shape.empty());
  EXPECT_EQ(file.tensors[2].size(), 1u);
  EXPECT_EQ(file.data_bytes(), 24u + 10u + 1u);
  EXPECT_EQ(file.file_size, 8 + file.header_bytes + 35u);

  ASSERT_GE(file.fd.get(), 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::vector<std::uint8_t> got(file.tensors[i].size());
    read_at(file.fd.get(), got, file.data_offset() + file.tensors[i].begin, path);
    EXPECT_EQ(got, std::vector<std::uint8_t>(tensors[i].bytes.begin(), tensors[i].bytes.end()))
        << tensors[i].name;
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_F(SafetensorsTest, WriterRejectsBytesThatDoNotMatchTheShape) {
  const auto bytes = pattern_bytes(15, 1);
  const std::vector<TensorData> tensors = {{"w", FERRY_DTYPE_F32, {2, 2}, bytes}};
  expect_error([&] { write_safetensors(dir_.file("x.safetensors"), tensors); },
               FERRY_STATUS_INVALID_ARGUMENT, {"'w'", "15 bytes given", "needs 16"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("x.safetensors")));
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  const auto bytes = pattern_bytes(4, 1);
  const std::vector<TensorData> tensors = {{"w", FERRY_DTYPE_U8, {4}, bytes},
                                           {"w", FERRY_DTYPE_U8, {4}, bytes}};
  expect_error([&] { write_safetensors(dir_.file("x.safetensors"), tensors); },
               FERRY_STATUS_INVALID_ARGUMENT, {"'w'", "used twice"});
}

TEST_F(SafetensorsTest, EmptyTensorsAreValidAnywhereInTheLayout) {
  // Two empty tensors at offset 0, one between data, one at the very end.
  write_raw(dir_.file("e.safetensors"),
            R"({"z0":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
            R"("z1":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]},)"
            R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
            R"("z2":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]},)"
            R"("b":{"dtype":"I16","shape":[2],"data_offsets":[4,8]},)"
            R"("z3":{"dtype":"BOOL","shape":[0],"data_offsets":[8,8]}})",
            8);
  Checkpoint ck = read_checkpoint(dir_.file("e.safetensors"));
  ASSERT_EQ(ck.files.size(), 1u);
  std::vector<std::string> names;
  for (const auto& t : ck.files[0].tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z0", "z1", "a", "z2", "b", "z3"}));
  EXPECT_EQ(ck.tensor_count(), 6u);
  EXPECT_EQ(ck.total_bytes(), 8u);
}

TEST_F(SafetensorsTest, FileWithNoTensorsAndNoDataIsValid) {
  write_raw(dir_.file("e.safetensors"), R"({"__metadata__":{"a":"b"}})", 0);
  Checkpoint ck = read_checkpoint(dir_.file("e.safetensors"));
  EXPECT_EQ(ck.tensor_count(), 0u);
  EXPECT_EQ(ck.files[0].metadata.at("a"), "b");
}

TEST_F(SafetensorsTest, HeaderPaddedWithSpacesIsAccepted) {
  write_raw(dir_.file("p.safetensors"),
            R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )", 2);
  EXPECT_EQ(read_checkpoint(dir_.file("p.safetensors")).tensor_count(), 1u);
}

TEST_F(SafetensorsTest, RejectsFileShorterThanTheLengthPrefix) {
  const std::string path = dir_.file("short.safetensors");
  test::write_bytes(path, std::string("\x05\x00\x00", 3));
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA,
               {path, "3 bytes", "shorter than the 8-byte header length prefix"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthOverTheLimit) {
  const std::string path = dir_.file("huge.safetensors");
  test::write_bytes(path, test::length_prefix(100'000'001) + "{}");
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA,
               {path, "header length 100000001 exceeds the limit of 100000000 bytes"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastTheEndOfTheFile) {
  const std::string path = dir_.file("cut.safetensors");
  test::write_bytes(path, test::length_prefix(64) + "{}");
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA,
               {path, "header length 64 runs past the end of the file (10 bytes"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotUtf8) {
  expect_corrupt("{\"a\xff\":{}}", 0, {"header is not valid UTF-8", "offset 3"});
}

TEST_F(SafetensorsTest, RejectsOverlongUtf8Encoding) {
  expect_corrupt("{\"\xc0\xaf\":{}}", 0, {"header is not valid UTF-8"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotJson) {
  expect_corrupt(R"({"a": {"dtype": "F32",)", 0, {"header is not valid JSON"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  expect_corrupt("[1, 2, 3]", 0, {"header is not a JSON object (it is array)"});
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  expect_corrupt(R"({"w": [1, 2]})", 0, {"tensor 'w'", "entry is not a JSON object"});
}

TEST_F(SafetensorsTest, RejectsEntryMissingDtype) {
  expect_corrupt(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "entry is missing \"dtype\""});
}

TEST_F(SafetensorsTest, RejectsEntryMissingShape) {
  expect_corrupt(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "entry is missing \"shape\""});
}

TEST_F(SafetensorsTest, RejectsEntryMissingDataOffsets) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[1]}})", 4,
                 {"tensor 'w'", "entry is missing \"data_offsets\""});
}

TEST_F(SafetensorsTest, RejectsDtypeThatIsNotAString) {
  expect_corrupt(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "\"dtype\" must be a string (it is number)"});
}

TEST_F(SafetensorsTest, RejectsShapeThatIsNotAnArray) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "\"shape\" must be an array (it is string)"});
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "\"shape\" must hold non-negative integers", "-1"});
}

TEST_F(SafetensorsTest, RejectsFractionalDimension) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "\"shape\" must hold non-negative integers"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsWithThreeNumbers) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4,
                 {"tensor 'w'", "\"data_offsets\" must be an array [begin, end]"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetThatIsAString) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})", 4,
                 {"tensor 'w'", "\"data_offsets\" must hold non-negative integers"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_corrupt(R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "unknown dtype 'F12'"});
}

TEST_F(SafetensorsTest, RejectsTorchSpellingOfDtype) {
  expect_corrupt(R"({"w":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "unknown dtype 'float32'"});
}

TEST_F(SafetensorsTest, AcceptsEverySupportedDtype) {
  const char* names[] = {"F64", "F32", "F16", "BF16", "I64", "I32",
                         "I16", "I8",  "U8",  "BOOL", "F8_E4M3", "F8_E5M2"};
  const int sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 1, 1};
  std::string header = "{";
  std::size_t offset = 0;
  for (int i = 0; i < 12; ++i) {
    const std::size_t bytes = 3 * static_cast<std::size_t>(sizes[i]);
    header += fmt::format(R"({}"t{}":{{"dtype":"{}","shape":[3],"data_offsets":[{},{}]}})",
                          i ? "," : "", i, names[i], offset, offset + bytes);
    offset += bytes;
  }
  header += "}";
  write_raw(dir_.file("all.safetensors"), header, offset);
  Checkpoint ck = read_checkpoint(dir_.file("all.safetensors"));
  ASSERT_EQ(ck.tensor_count(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(ck.files[0].tensors[static_cast<std::size_t>(i)].dtype,
              static_cast<ferry_dtype_t>(i + 1))
        << names[i];
  }
}

TEST_F(SafetensorsTest, RejectsBeginGreaterThanEnd) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4,
                 {"tensor 'w'", "data_offsets [4, 0] have begin greater than end"});
}

TEST_F(SafetensorsTest, RejectsSpanThatDoesNotMatchTheShape) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12,
                 {"tensor 'w'", "data_offsets [0, 12] span 12 bytes but shape [2, 2] of F32 "
                                "needs 16 bytes"});
}

TEST_F(SafetensorsTest, RejectsShapeWhoseByteSizeOverflows) {
  expect_corrupt(
      R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
      {"tensor 'w'", "overflows a 64-bit byte size"});
}

TEST_F(SafetensorsTest, RejectsDataThatDoesNotStartAtZero) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8,
                 {"tensor 'w'", "the first tensor must start at offset 0 (gap of 4 bytes)"});
}

TEST_F(SafetensorsTest, RejectsGapBetweenTensors) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                 12, {"tensor 'b'", "gap of 4 bytes after tensor 'a'"});
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                 8, {"tensor 'b'", "data_offsets [4, 8] overlap tensor 'a' [0, 8]"});
}

TEST_F(SafetensorsTest, RejectsTensorsSharingTheSameBytes) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                 4, {"tensor 'b'", "overlap tensor 'a'"});
}

TEST_F(SafetensorsTest, RejectsTrailingBytesAfterTheLastTensor) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 6,
                 {"the tensors end at byte 4 but the data section is 6 bytes",
                  "2 trailing bytes belong to no tensor"});
}

TEST_F(SafetensorsTest, RejectsTensorPastTheEndOfTheData) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                 6, {"tensor 'b'", "run past the end of the data section (6 bytes)"});
}

TEST_F(SafetensorsTest, RejectsDuplicateTensorNames) {
  expect_corrupt(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                 8, {"duplicate tensor name 'a' in the header"});
}

TEST_F(SafetensorsTest, RejectsDuplicateKeyInsideAnEntry) {
  expect_corrupt(R"({"a":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4,
                 {"duplicate key 'dtype' inside 'a'"});
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotAnObject) {
  expect_corrupt(R"({"__metadata__":["x"]})", 0,
                 {"__metadata__ must be an object of string to string (it is array)"});
}

TEST_F(SafetensorsTest, RejectsMetadataWithANonStringValue) {
  expect_corrupt(R"({"__metadata__":{"step":12}})", 0,
                 {"__metadata__ must be an object of string to string (key 'step' is number)"});
}

TEST_F(SafetensorsTest, RejectsEmptyTensorName) {
  expect_corrupt(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0,
                 {"a tensor has an empty name"});
}

TEST_F(SafetensorsTest, RejectsMoreThanEightDims) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1,
                 {"tensor 'w'", "shape has 9 dims, more than 8"});
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  expect_corrupt(R"({"__metadata__":)" + std::string(40, '[') + std::string(40, ']') + "}", 0,
                 {"header nests deeper than 16 levels"});
}

TEST_F(SafetensorsTest, RejectsFileTruncatedInsideTheData) {
  const auto bytes = pattern_bytes(64, 1);
  const std::vector<TensorData> tensors = {{"a", FERRY_DTYPE_F32, {8}, {bytes.data(), 32}},
                                           {"b", FERRY_DTYPE_F32, {8}, {bytes.data() + 32, 32}}};
  const std::string path = dir_.file("t.safetensors");
  write_safetensors(path, tensors);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 5);
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA,
               {path, "tensor 'b'", "run past the end of the data section (59 bytes)"});
}

TEST_F(SafetensorsTest, RejectsFileTruncatedInsideTheHeader) {
  const auto bytes = pattern_bytes(4, 1);
  const std::vector<TensorData> tensors = {{"a", FERRY_DTYPE_F32, {1}, bytes}};
  const std::string path = dir_.file("t.safetensors");
  write_safetensors(path, tensors);
  std::filesystem::resize_file(path, 20);
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_CORRUPT_DATA,
               {path, "runs past the end of the file (20 bytes"});
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = dir_.file("absent.safetensors");
  expect_error([&] { read_checkpoint(path); }, FERRY_STATUS_NOT_FOUND,
               {path, "no such file or directory"});
}

// ---- directories and sharded checkpoints ----------------------------------------------------

class ShardedTest : public SafetensorsTest {
 protected:
  // Three shards: a has w0,w1; b has w2; c has w3,w4.
  void write_shards() {
    write_shard("model-00001-of-00003.safetensors", {"w0", "w1"});
    write_shard("model-00002-of-00003.safetensors", {"w2"});
    write_shard("model-00003-of-00003.safetensors", {"w3", "w4"});
  }
  void write_shard(const std::string& file, const std::vector<std::string>& names) {
    std::vector<std::vector<std::uint8_t>> storage;
    std::vector<TensorData> tensors;
    for (std::size_t i = 0; i < names.size(); ++i) {
      storage.push_back(pattern_bytes(16, static_cast<std::uint32_t>(i)));
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      tensors.push_back({names[i], FERRY_DTYPE_F32, {4}, storage[i]});
    }
    write_safetensors(dir_.file(file), tensors);
  }
  std::map<std::string, std::string> good_map() const {
    return {{"w0", "model-00001-of-00003.safetensors"},
            {"w1", "model-00001-of-00003.safetensors"},
            {"w2", "model-00002-of-00003.safetensors"},
            {"w3", "model-00003-of-00003.safetensors"},
            {"w4", "model-00003-of-00003.safetensors"}};
  }
  std::string index() const { return dir_.file(kIndexFileName); }
  void expect_rejected(ferry_status_code_t code, const std::vector<std::string>& parts) {
    expect_error([&] { read_checkpoint(dir_.path().string()); }, code, parts);
  }
};

TEST_F(ShardedTest, IndexedDirectoryListsShardsInNameOrder) {
  write_shards();
  write_index(index(), good_map(), 80);
  // An unrelated file next to the shards is not part of the checkpoint.
  write_raw(dir_.file("consolidated.safetensors"), "{}", 0);
  Checkpoint ck = read_checkpoint(dir_.path().string());
  EXPECT_EQ(ck.index_path, index());
  ASSERT_EQ(ck.files.size(), 3u);
  EXPECT_EQ(ck.files[0].path, dir_.file("model-00001-of-00003.safetensors"));
  EXPECT_EQ(ck.files[2].path, dir_.file("model-00003-of-00003.safetensors"));
  EXPECT_EQ(ck.tensor_count(), 5u);
  EXPECT_EQ(ck.total_bytes(), 80u);
}

TEST_F(ShardedTest, IndexFileItselfCanBeTheCheckpointPath) {
  write_shards();
  write_index(index(), good_map(), 80);
  EXPECT_EQ(read_checkpoint(index()).tensor_count(), 5u);
}

TEST_F(ShardedTest, RejectsMissingShard) {
  write_shards();
  auto map = good_map();
  map["w5"] = "model-00004-of-00003.safetensors";
  write_index(index(), map, 80);
  expect_rejected(FERRY_STATUS_NOT_FOUND,
                  {index(), "shard 'model-00004-of-00003.safetensors' (listed for tensor 'w5') "
                            "does not exist"});
}

TEST_F(ShardedTest, RejectsTensorListedInIndexButAbsentFromItsShard) {
  write_shards();
  auto map = good_map();
  map["ghost"] = "model-00002-of-00003.safetensors";
  write_index(index(), map, 80);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {index(), "tensor 'ghost' is listed in shard 'model-00002-of-00003.safetensors' "
                            "but that shard does not contain it"});
}

TEST_F(ShardedTest, RejectsTensorInShardButNotInIndex) {
  write_shards();
  auto map = good_map();
  map.erase("w4");
  write_index(index(), map, 80);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {dir_.file("model-00003-of-00003.safetensors"),
                   "tensor 'w4' is in this shard but not in the index"});
}

TEST_F(ShardedTest, RejectsTensorInAnotherShardThanTheIndexSays) {
  write_shards();
  auto map = good_map();
  map["w2"] = "model-00001-of-00003.safetensors";
  write_index(index(), map, 80);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {"tensor 'w2'", "model-00001-of-00003.safetensors"});
}

TEST_F(ShardedTest, RejectsTensorAlsoPresentInAShardTheIndexDoesNotName) {
  write_shard("model-00001-of-00003.safetensors", {"w0", "w1"});
  write_shard("model-00002-of-00003.safetensors", {"w2", "w0"});
  write_shard("model-00003-of-00003.safetensors", {"w3", "w4"});
  write_index(index(), good_map(), 80);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {dir_.file("model-00002-of-00003.safetensors"),
                   "tensor 'w0' is in this shard but the index",
                   "places it in shard 'model-00001-of-00003.safetensors'"});
}

TEST_F(ShardedTest, RejectsInvalidShardNamingIt) {
  write_shards();
  write_index(index(), good_map(), 80);
  const std::string bad = dir_.file("model-00002-of-00003.safetensors");
  std::filesystem::resize_file(bad, std::filesystem::file_size(bad) - 1);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA, {bad, "tensor 'w2'", "run past the end"});
}

TEST_F(ShardedTest, RejectsIndexWithoutWeightMap) {
  write_shards();
  test::write_bytes(index(), R"({"metadata": {"total_size": 80}})");
  expect_rejected(FERRY_STATUS_CORRUPT_DATA, {index(), "index has no \"weight_map\" object"});
}

TEST_F(ShardedTest, RejectsIndexWithDuplicateTensor) {
  write_shards();
  test::write_bytes(index(), R"({"weight_map": {"w0": "model-00001-of-00003.safetensors",
                                                "w0": "model-00002-of-00003.safetensors"}})");
  expect_rejected(FERRY_STATUS_CORRUPT_DATA, {index(), "duplicate key 'w0' inside 'weight_map'"});
}

TEST_F(ShardedTest, RejectsIndexThatIsNotJson) {
  write_shards();
  test::write_bytes(index(), R"({"weight_map": )");
  expect_rejected(FERRY_STATUS_CORRUPT_DATA, {index(), "index is not valid JSON"});
}

TEST_F(ShardedTest, RejectsShardPathLeavingTheDirectory) {
  write_shards();
  auto map = good_map();
  map["w0"] = "../model-00001-of-00003.safetensors";
  write_index(index(), map, 80);
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {index(), "'w0'", "not a relative path inside the checkpoint directory"});
}

TEST_F(ShardedTest, RejectsWeightMapEntryThatIsNotAString) {
  write_shards();
  test::write_bytes(index(), R"({"weight_map": {"w0": 1}})");
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {index(), "weight_map entry 'w0' must be a shard file name string"});
}

TEST_F(ShardedTest, DirectoryWithOneFileAndNoIndexIsAccepted) {
  write_shard("model.safetensors", {"a", "b"});
  Checkpoint ck = read_checkpoint(dir_.path().string());
  EXPECT_EQ(ck.index_path, "");
  ASSERT_EQ(ck.files.size(), 1u);
  EXPECT_EQ(ck.tensor_count(), 2u);
}

TEST_F(ShardedTest, DirectoryWithSeveralFilesAndNoIndexReadsThemAll) {
  write_shards();
  Checkpoint ck = read_checkpoint(dir_.path().string());
  ASSERT_EQ(ck.files.size(), 3u);
  EXPECT_EQ(ck.tensor_count(), 5u);
}

TEST_F(ShardedTest, DirectoryWithoutIndexRejectsCollidingNames) {
  write_shard("a.safetensors", {"x", "y"});
  write_shard("b.safetensors", {"y"});
  expect_rejected(FERRY_STATUS_CORRUPT_DATA,
                  {dir_.file("b.safetensors"), "tensor 'y' is also in",
                   dir_.file("a.safetensors")});
}

TEST_F(ShardedTest, EmptyDirectoryIsNotFound) {
  expect_rejected(FERRY_STATUS_NOT_FOUND, {"directory has no .safetensors files"});
}

}  // namespace
}  // namespace ferry::safetensors
