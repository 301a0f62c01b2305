// tests/disk/disk_plugin_test.cpp: libferry_transport_disk.so through its C table (dlopen'ed
// directly): a sharded checkpoint of every dtype read back in small buckets is byte-identical,
// and bad input comes back as error objects with the right code and message.
#include <ferry/plugin.h>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/manifest.hpp>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/host_api.hpp"
#include <ferry/formats/safetensors.hpp>
#include "tests/common/plugin_loader.hpp"
#include "temp_dir.hpp"

namespace ferry {
namespace {

using test::pattern_bytes;
using test::TempDir;

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Expected {
  ferry_dtype_t dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};

class DiskPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = test::load_transport_plugin("FERRY_DISK_PLUGIN", "disk");
    ASSERT_NE(api_, nullptr) << "set FERRY_DISK_PLUGIN to libferry_transport_disk.so";
    ASSERT_GE(api_->struct_size, FERRY_STRUCT_SIZE(ferry_transport_api_t, source_close));
    transport_ = create({});
    ASSERT_NE(transport_, nullptr);
  }
  void TearDown() override {
    if (transport_ != nullptr) api_->destroy(transport_);
  }

  ferry_transport_t* create(const std::vector<ferry_option_t>& options,
                            ErrorPtr* error_out = nullptr) {
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = FERRY_ROLE_RECEIVER;
    args.options = options.data();
    args.num_options = options.size();
    args.device = -1;
    ferry_transport_t* out = nullptr;
    ErrorPtr error(api_->create(&args, &out));
    if (error_out) *error_out = std::move(error);
    else EXPECT_EQ(error, nullptr) << error_message(error.get());
    return out;
  }

  // Three shards with an index: every dtype, scalars, an empty tensor, tensors of several sizes.
  void write_checkpoint() {
    const ferry_dtype_t dtypes[] = {
        FERRY_DTYPE_F64, FERRY_DTYPE_F32, FERRY_DTYPE_F16,  FERRY_DTYPE_BF16,
        FERRY_DTYPE_I64, FERRY_DTYPE_I32, FERRY_DTYPE_I16,  FERRY_DTYPE_I8,
        FERRY_DTYPE_U8,  FERRY_DTYPE_BOOL, FERRY_DTYPE_F8_E4M3, FERRY_DTYPE_F8_E5M2};
    const std::vector<std::vector<std::uint64_t>> shapes = {{7, 5}, {3}, {}, {2, 0}, {33, 9}, {1, 1, 13}};
    std::map<std::string, std::string> weight_map;
    std::uint32_t seed = 1;
    std::uint64_t total = 0;
    for (int shard = 0; shard < 3; ++shard) {
      const std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00003.safetensors";
      std::vector<safetensors::TensorData> tensors;
      for (int d = shard; d < 12; d += 3) {
        for (std::size_t s = 0; s < shapes.size(); ++s) {
          const std::string name = "layers." + std::to_string(d) + "." + dtype_name(dtypes[d]) +
                                   ".s" + std::to_string(s);
          const auto size = *byte_size(dtypes[d], shapes[s]);
          expected_[name] = {dtypes[d], shapes[s], pattern_bytes(size, seed++)};
          catalog_order_.push_back(name);
          weight_map[name] = file;
          total += size;
        }
      }
      for (std::size_t i = catalog_order_.size() - 24; i < catalog_order_.size(); ++i) {
        const auto& e = expected_[catalog_order_[i]];
        tensors.push_back({catalog_order_[i], e.dtype, e.shape, e.bytes});
      }
      safetensors::write_safetensors(dir_.file(file), tensors, {{"format", "pt"}});
    }
    safetensors::write_index(dir_.file(safetensors::kIndexFileName), weight_map, total);
  }

  ferry_source_t* open(const std::string& uri, ErrorPtr* error_out = nullptr) {
    ferry_source_t* source = nullptr;
    ErrorPtr error(api_->source_open(transport_, uri.c_str(), &source));
    if (error_out) *error_out = std::move(error);
    else EXPECT_EQ(error, nullptr) << error_message(error.get());
    return source;
  }

  // One source_read into `dst`; returns the error (NULL on success) and fills `manifest`.
  ErrorPtr read(ferry_source_t* source, std::vector<std::uint8_t>& dst,
                manifest::Manifest* manifest, std::uint32_t threads = 3,
                std::int64_t deadline = 0) {
    ferry_source_read_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written);
    args.dst = dst.data();
    args.dst_capacity = dst.size();
    args.num_threads = threads;
    args.deadline_ns = deadline;
    ErrorPtr error(api_->source_read(source, &args));
    if (!error) {
      EXPECT_NE(args.manifest.data, nullptr);
      *manifest = manifest::decode({args.manifest.data, args.manifest.size});
      EXPECT_EQ(args.bytes_written, manifest->bucket_bytes);
      EXPECT_LE(args.bytes_written, dst.size());
      args.manifest.release(args.manifest.data, args.manifest.release_ctx);
    } else {
      EXPECT_EQ(args.manifest.data, nullptr);
      EXPECT_EQ(args.bytes_written, 0u);
    }
    return error;
  }

  // Reads every bucket with the given capacities (the last one repeats), checks the manifests,
  // and returns the tensors reassembled from the buckets, in delivery order.
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> read_all(
      ferry_source_t* source, std::vector<std::uint64_t> capacities) {
    std::vector<std::pair<std::string, std::vector<std::uint8_t>>> out;
    std::uint32_t index = 0;
    std::uint32_t last_count = 0;
    for (;;) {
      const std::uint64_t capacity = capacities[std::min<std::size_t>(index, capacities.size() - 1)];
      std::vector<std::uint8_t> dst(capacity, 0xEE);
      manifest::Manifest m;
      ErrorPtr error = read(source, dst, &m);
      if (error) {
        EXPECT_EQ(error_code(error.get()), FERRY_STATUS_END_OF_STREAM) << error_message(error.get());
        EXPECT_EQ(index, last_count) << "bucket_count of the last bucket = buckets delivered";
        return out;
      }
      EXPECT_EQ(m.bucket_index, index);
      EXPECT_LT(m.bucket_index, m.bucket_count);
      EXPECT_EQ(m.version, 0u);
      last_count = m.bucket_count;
      EXPECT_FALSE(m.tensors.empty());
      for (const auto& entry : m.tensors) {
        EXPECT_EQ(entry.offset % 256, 0u) << entry.name;
        const auto& e = expected_.at(entry.name);
        EXPECT_EQ(entry.dtype, e.dtype) << entry.name;
        EXPECT_EQ(entry.shape, e.shape) << entry.name;
        out.emplace_back(entry.name, std::vector<std::uint8_t>(dst.begin() + entry.offset,
                                                               dst.begin() + entry.offset + entry.size));
      }
      ++index;
    }
  }

  void expect_all_tensors(const std::vector<std::pair<std::string, std::vector<std::uint8_t>>>& got) {
    ASSERT_EQ(got.size(), catalog_order_.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, catalog_order_[i]);
      EXPECT_EQ(got[i].second, expected_.at(got[i].first).bytes) << got[i].first;
    }
  }

  const ferry_transport_api_t* api_ = nullptr;
  ferry_transport_t* transport_ = nullptr;
  TempDir dir_;
  std::map<std::string, Expected> expected_;
  // File order, then offset order (the writer lays tensors out in the order given).
  std::vector<std::string> catalog_order_;
};

TEST_F(DiskPluginTest, DeclaresSourceCapabilityForHostMemory) {
  ferry_transport_caps_t caps{};
  caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
  ErrorPtr error(api_->get_caps(&caps));
  ASSERT_EQ(error, nullptr);
  EXPECT_EQ(caps.flags, static_cast<std::uint32_t>(FERRY_TRANSPORT_CAP_SOURCE));
  EXPECT_EQ(caps.memory_kinds,
            static_cast<std::uint32_t>(FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED));
}

TEST_F(DiskPluginTest, GetCapsFillsOnlyTheFieldsTheCallerHas) {
  ferry_transport_caps_t caps{};
  caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, flags);
  caps.memory_kinds = 0xABCD;
  ErrorPtr error(api_->get_caps(&caps));
  ASSERT_EQ(error, nullptr);
  EXPECT_EQ(caps.flags, static_cast<std::uint32_t>(FERRY_TRANSPORT_CAP_SOURCE));
  EXPECT_EQ(caps.memory_kinds, 0xABCDu);
  EXPECT_EQ(caps.struct_size, FERRY_STRUCT_SIZE(ferry_transport_caps_t, flags));
}

TEST_F(DiskPluginTest, CreateRejectsUnknownOptionNamingIt) {
  ErrorPtr error;
  EXPECT_EQ(create({{"prefetch", "1"}}, &error), nullptr);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error_message(error.get()).find("unknown option 'prefetch'"), std::string::npos)
      << error_message(error.get());
}

TEST_F(DiskPluginTest, CreateRejectsBadReadThreads) {
  ErrorPtr error;
  EXPECT_EQ(create({{"read_threads", "4x"}}, &error), nullptr);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error_message(error.get()).find("'read_threads' = '4x'"), std::string::npos)
      << error_message(error.get());
  ferry_transport_t* ok = create({{"read_threads", "4"}});
  EXPECT_NE(ok, nullptr);
  api_->destroy(ok);
}

TEST_F(DiskPluginTest, CatalogListsEveryTensorInFileThenOffsetOrder) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  ferry_blob_t blob{};
  ErrorPtr error(api_->source_catalog(source, &blob));
  ASSERT_EQ(error, nullptr) << error_message(error.get());
  const manifest::Manifest catalog = manifest::decode({blob.data, blob.size});
  blob.release(blob.data, blob.release_ctx);
  EXPECT_EQ(catalog.bucket_count, 0u);
  ASSERT_EQ(catalog.tensors.size(), catalog_order_.size());
  for (std::size_t i = 0; i < catalog.tensors.size(); ++i) {
    const auto& entry = catalog.tensors[i];
    EXPECT_EQ(entry.name, catalog_order_[i]);
    EXPECT_EQ(entry.offset, 0u);
    EXPECT_EQ(entry.size, expected_.at(entry.name).bytes.size());
  }
  api_->source_close(source);
}

TEST_F(DiskPluginTest, SmallBucketsReassembleEveryTensorOfEveryDtypeExactly) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  // The largest tensor (33 x 9 x 8 bytes) fits; most buckets hold a few tensors.
  expect_all_tensors(read_all(source, {2400}));
  api_->source_close(source);
}

TEST_F(DiskPluginTest, OneBigBucketHoldsTheWholeCheckpoint) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  std::vector<std::uint8_t> dst(1 << 20);
  manifest::Manifest m;
  ASSERT_EQ(read(source, dst, &m), nullptr);
  EXPECT_EQ(m.bucket_count, 1u);
  EXPECT_EQ(m.tensors.size(), catalog_order_.size());
  ErrorPtr end = read(source, dst, &m);
  EXPECT_EQ(error_code(end.get()), FERRY_STATUS_END_OF_STREAM);
  api_->source_close(source);
}

TEST_F(DiskPluginTest, CapacityChangeMidStreamReplansTheRemainingBuckets) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  expect_all_tensors(read_all(source, {2400, 2400, 9000, 3000}));
  api_->source_close(source);
}

TEST_F(DiskPluginTest, TensorLargerThanTheBucketIsRejectedByName) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  std::vector<std::uint8_t> dst(1000);
  manifest::Manifest m;
  ErrorPtr error = read(source, dst, &m);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error_message(error.get()).find("tensor 'layers.0.F64.s4' is 2376 bytes, larger than "
                                            "the destination bucket of 1000 bytes"),
            std::string::npos)
      << error_message(error.get());
  // Nothing was consumed: the same capacity fails the same way, a larger one starts at bucket 0.
  ErrorPtr again = read(source, dst, &m);
  EXPECT_EQ(error_code(again.get()), FERRY_STATUS_INVALID_ARGUMENT) << error_message(again.get());
  std::vector<std::uint8_t> big(1 << 20);
  ASSERT_EQ(read(source, big, &m), nullptr);
  EXPECT_EQ(m.bucket_index, 0u);
  EXPECT_EQ(m.tensors.size(), catalog_order_.size());
  api_->source_close(source);
}

TEST_F(DiskPluginTest, RefusedCapacityMidStreamLeavesTheStreamUsable) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  std::vector<std::uint8_t> dst(2400);
  std::vector<std::uint8_t> small(1000);
  manifest::Manifest m;
  ASSERT_EQ(read(source, dst, &m), nullptr);
  EXPECT_EQ(m.bucket_index, 0u);
  ErrorPtr error = read(source, small, &m);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_INVALID_ARGUMENT) << error_message(error.get());
  ASSERT_EQ(read(source, dst, &m), nullptr);
  EXPECT_EQ(m.bucket_index, 1u);
  api_->source_close(source);
}

TEST_F(DiskPluginTest, LargeTensorIsSplitAcrossThreadsAndReadExactly) {
  // 20 MiB (above the 16 MiB chunk) after a small tensor, so it is read in pieces.
  const std::vector<std::uint64_t> shape = {5 << 20};
  expected_["small"] = {FERRY_DTYPE_I8, {3}, pattern_bytes(3, 1)};
  expected_["big"] = {FERRY_DTYPE_F32, shape, pattern_bytes(20 << 20, 2)};
  catalog_order_ = {"small", "big"};
  const std::vector<safetensors::TensorData> tensors = {
      {"small", FERRY_DTYPE_I8, {3}, expected_["small"].bytes},
      {"big", FERRY_DTYPE_F32, shape, expected_["big"].bytes}};
  safetensors::write_safetensors(dir_.file("big.safetensors"), tensors);
  ferry_source_t* source = open(dir_.file("big.safetensors"));
  ASSERT_NE(source, nullptr);
  std::vector<std::uint8_t> dst((20 << 20) + 4096, 0xEE);
  manifest::Manifest m;
  ASSERT_EQ(read(source, dst, &m, /*threads=*/4), nullptr);
  ASSERT_EQ(m.tensors.size(), 2u);
  EXPECT_EQ(m.tensors[1].offset, 256u);
  EXPECT_TRUE(std::equal(dst.begin() + 256, dst.begin() + 256 + (20 << 20),
                         expected_["big"].bytes.begin()));
  // Padding between the tensors is zeroed.
  EXPECT_TRUE(std::all_of(dst.begin() + 3, dst.begin() + 256, [](auto b) { return b == 0; }));
  api_->source_close(source);
}

TEST_F(DiskPluginTest, OpenRejectsAnInvalidCheckpointBeforeAnyBucket) {
  write_checkpoint();
  const std::string bad = dir_.file("model-00002-of-00003.safetensors");
  std::filesystem::resize_file(bad, std::filesystem::file_size(bad) + 3);
  ErrorPtr error;
  EXPECT_EQ(open(dir_.path().string(), &error), nullptr);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(error_message(error.get()).find(bad), std::string::npos) << error_message(error.get());
  EXPECT_NE(error_message(error.get()).find("3 trailing bytes belong to no tensor"),
            std::string::npos)
      << error_message(error.get());
}

TEST_F(DiskPluginTest, OpenOfAMissingPathIsNotFound) {
  ErrorPtr error;
  EXPECT_EQ(open(dir_.file("nothing"), &error), nullptr);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_NOT_FOUND);
}

// A FIFO in place of a shard (or as the path itself) is refused at once, naming it, instead of
// an open that waits for a writer forever; so are devices.
TEST_F(DiskPluginTest, NonRegularFilesAreRefusedWithoutBlocking) {
  write_checkpoint();
  const std::string shard = dir_.file("model-00002-of-00003.safetensors");
  std::filesystem::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  for (const std::string& uri : {dir_.path().string(), shard, std::string("/dev/zero")}) {
    ErrorPtr error;
    EXPECT_EQ(open(uri, &error), nullptr) << uri;
    EXPECT_EQ(error_code(error.get()), FERRY_STATUS_INVALID_ARGUMENT) << uri;
    const std::string message = error_message(error.get());
    EXPECT_NE(message.find(uri == "/dev/zero" ? "/dev/zero: is a character device"
                                              : shard + ": is a FIFO (named pipe)"),
              std::string::npos)
        << message;
  }
  // Without an index, a folder's *.safetensors FIFO is refused too, not skipped.
  std::filesystem::remove(dir_.file(safetensors::kIndexFileName));
  ErrorPtr error;
  EXPECT_EQ(open(dir_.path().string(), &error), nullptr);
  EXPECT_NE(error_message(error.get()).find(shard + ": is a FIFO"), std::string::npos)
      << error_message(error.get());
}

// The file no longer holds what its header said: CORRUPT_DATA (a client's mistake, HTTP 400), not
// an I/O failure.
TEST_F(DiskPluginTest, FileTruncatedAfterOpenIsCorruptDataNamingIt) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  const std::string shard = dir_.file("model-00001-of-00003.safetensors");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 100);
  std::vector<std::uint8_t> dst(1 << 20);
  manifest::Manifest m;
  ErrorPtr error = read(source, dst, &m);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(error_message(error.get()).find(shard + ": short read"), std::string::npos)
      << error_message(error.get());
  api_->source_close(source);
}

TEST_F(DiskPluginTest, ReadAfterAbortFailsWithTheReason) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  api_->abort(transport_, "operator pressed stop");
  std::vector<std::uint8_t> dst(1 << 20);
  manifest::Manifest m;
  ErrorPtr error = read(source, dst, &m);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_ABORTED);
  EXPECT_NE(error_message(error.get()).find("operator pressed stop"), std::string::npos);
  api_->source_close(source);
}

TEST_F(DiskPluginTest, ReadPastItsDeadlineTimesOut) {
  write_checkpoint();
  ferry_source_t* source = open(dir_.path().string());
  ASSERT_NE(source, nullptr);
  std::vector<std::uint8_t> dst(1 << 20);
  manifest::Manifest m;
  ErrorPtr error = read(source, dst, &m, 2, now_ns() - 1);
  EXPECT_EQ(error_code(error.get()), FERRY_STATUS_TIMEOUT);
  EXPECT_NE(error_message(error.get()).find("deadline"), std::string::npos);
  // The bucket was not consumed: a read without a deadline delivers it from the start.
  ASSERT_EQ(read(source, dst, &m), nullptr);
  EXPECT_EQ(m.bucket_index, 0u);
  api_->source_close(source);
}

}  // namespace
}  // namespace ferry
