// Tests of the SDK's manifest encode/decode/validate: round trips of every field, and a hostile
// corpus (each case asserts the rule its error message states).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tensor_meta.capnp.h"

namespace fm = ferry::manifest;

namespace {

fm::Entry entry(std::string name, ferry_dtype_t dtype, std::vector<std::uint64_t> shape,
                std::uint64_t offset) {
  fm::Entry e;
  e.name = std::move(name);
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.offset = offset;
  e.size = *ferry::byte_size(e.dtype, e.shape);
  return e;
}

// A valid two-tensor bucket: 'a' [0, 24), 'b' [32, 48) in a 64-byte bucket.
fm::Manifest bucket() {
  fm::Manifest m;
  m.version = 7;
  m.version_label = "step-7";
  m.bucket_index = 1;
  m.bucket_count = 3;
  m.bucket_bytes = 64;
  m.tensors.push_back(entry("a", FERRY_DTYPE_F32, {2, 3}, 0));
  m.tensors.push_back(entry("b", FERRY_DTYPE_BF16, {8}, 32));
  return m;
}

// Builds a message directly with the generated builder, bypassing encode()'s validation, so that
// hostile content reaches decode().
std::vector<std::uint8_t> raw(const std::function<void(ferry::schema::Manifest::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  fill(message.initRoot<ferry::schema::Manifest>());
  const auto flat = capnp::messageToFlatArray(message);
  const auto bytes = flat.asBytes();
  return {bytes.begin(), bytes.end()};
}

// One F32 [4] tensor named `name` at offset 0 of a 16-byte single bucket.
void one_tensor(ferry::schema::Manifest::Builder m, const std::string& name) {
  m.setBucketCount(1);
  m.setBucketBytes(16);
  auto t = m.initTensors(1)[0];
  t.setName(capnp::Text::Reader(name.data(), name.size()));
  t.setDtype(ferry::schema::DType::F32);
  t.initShape(1).set(0, 4);
  t.setSize(16);
}

// The message of the CORRUPT_DATA error decode() throws (fails the test if it does not throw).
std::string decode_error(const std::vector<std::uint8_t>& bytes, const fm::Limits& limits = {}) {
  try {
    fm::decode(bytes, limits);
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "decode accepted the message";
  return {};
}

std::string validate_error(const fm::Manifest& m, const fm::Limits& limits = {}) {
  try {
    fm::validate(m, limits);
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "validate accepted the manifest";
  return {};
}

// validate() and decode(encode-without-validation) must agree on the same broken manifest.
std::vector<std::uint8_t> raw_from(const fm::Manifest& m) {
  return raw([&](ferry::schema::Manifest::Builder root) {
    root.setVersion(m.version);
    root.setBucketIndex(m.bucket_index);
    root.setBucketCount(m.bucket_count);
    root.setBucketBytes(m.bucket_bytes);
    auto list = root.initTensors(static_cast<unsigned>(m.tensors.size()));
    for (unsigned i = 0; i < m.tensors.size(); ++i) {
      const fm::Entry& e = m.tensors[i];
      auto t = list[i];
      t.setName(capnp::Text::Reader(e.name.data(), e.name.size()));
      t.setDtype(static_cast<ferry::schema::DType>(e.dtype));
      auto shape = t.initShape(static_cast<unsigned>(e.shape.size()));
      for (unsigned d = 0; d < e.shape.size(); ++d) shape.set(d, e.shape[d]);
      t.setOffset(e.offset);
      t.setSize(e.size);
    }
  });
}

// Both paths reject `m` with the same message; returns it.
std::string both_reject(const fm::Manifest& m) {
  const std::string from_validate = validate_error(m);
  EXPECT_EQ(decode_error(raw_from(m)), from_validate);
  return from_validate;
}

}  // namespace

TEST(Manifest, RoundTripKeepsEveryField) {
  fm::Manifest m = bucket();
  m.tensors[0].fingerprint = 0x0123456789abcdefull;
  m.tensors[1].quantization = fm::Quantization{"fp8-block", 128, 64, FERRY_DTYPE_BF16, "ue8m0"};
  m.tensors[1].sharding = fm::Sharding{0, 2, 4};

  const fm::Manifest out = fm::decode(fm::encode(m));
  EXPECT_EQ(out.version, 7u);
  EXPECT_EQ(out.version_label, "step-7");
  EXPECT_EQ(out.bucket_index, 1u);
  EXPECT_EQ(out.bucket_count, 3u);
  EXPECT_EQ(out.bucket_bytes, 64u);
  ASSERT_EQ(out.tensors.size(), 2u);
  const fm::Entry& a = out.tensors[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(a.shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.size, 24u);
  ASSERT_TRUE(a.fingerprint.has_value());
  EXPECT_EQ(*a.fingerprint, 0x0123456789abcdefull);
  EXPECT_FALSE(a.quantization.has_value());
  EXPECT_FALSE(a.sharding.has_value());
  const fm::Entry& b = out.tensors[1];
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(b.shape, (std::vector<std::uint64_t>{8}));
  EXPECT_EQ(b.offset, 32u);
  EXPECT_EQ(b.size, 16u);
  EXPECT_FALSE(b.fingerprint.has_value());
  ASSERT_TRUE(b.quantization.has_value());
  EXPECT_EQ(b.quantization->scheme, "fp8-block");
  EXPECT_EQ(b.quantization->block_rows, 128u);
  EXPECT_EQ(b.quantization->block_cols, 64u);
  EXPECT_EQ(b.quantization->scale_dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(b.quantization->scale_format, "ue8m0");
  ASSERT_TRUE(b.sharding.has_value());
  EXPECT_EQ(b.sharding->dim, 0u);
  EXPECT_EQ(b.sharding->index, 2u);
  EXPECT_EQ(b.sharding->count, 4u);
}

TEST(Manifest, RoundTripKeepsScalarsAndEmptyTensors) {
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 8;
  m.tensors.push_back(entry("scalar", FERRY_DTYPE_I64, {}, 0));
  m.tensors.push_back(entry("empty", FERRY_DTYPE_F16, {0, 5}, 8));
  const fm::Manifest out = fm::decode(fm::encode(m));
  ASSERT_EQ(out.tensors.size(), 2u);
  EXPECT_TRUE(out.tensors[0].shape.empty());
  EXPECT_EQ(out.tensors[0].size, 8u);
  EXPECT_EQ(out.tensors[1].shape, (std::vector<std::uint64_t>{0, 5}));
  EXPECT_EQ(out.tensors[1].size, 0u);
}

TEST(Manifest, DecodeAcceptsMisalignedBytes) {
  const auto bytes = fm::encode(bucket());
  std::vector<std::uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  const fm::Manifest out =
      fm::decode(std::span<const std::uint8_t>(shifted.data() + 1, bytes.size()));
  ASSERT_EQ(out.tensors.size(), 2u);
  EXPECT_EQ(out.tensors[1].name, "b");
  EXPECT_EQ(out.tensors[1].offset, 32u);
}

TEST(Manifest, CatalogSkipsBucketRules) {
  // A catalog (bucket_count 0) lists tensors at file offsets: unsorted and past any bucket.
  fm::Manifest m;
  m.tensors.push_back(entry("late", FERRY_DTYPE_F32, {4}, 1u << 30));
  m.tensors.push_back(entry("early", FERRY_DTYPE_F32, {4}, 0));
  const fm::Manifest out = fm::decode(fm::encode(m));
  EXPECT_EQ(out.tensors[0].offset, 1u << 30);
  EXPECT_EQ(out.bucket_count, 0u);
}

TEST(Manifest, EncodeValidatesFirst) {
  fm::Manifest m = bucket();
  m.tensors[1].name = "a";
  try {
    fm::encode(m);
    FAIL() << "encode accepted a duplicate name";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "manifest: tensor 'a' (index 1): duplicate name (first at index 0)");
  }
}

// ---- hostile corpus -------------------------------------------------------------------------

TEST(ManifestHostile, EmptyInput) {
  EXPECT_EQ(decode_error({}), "manifest: empty input");
}

TEST(ManifestHostile, NotWholeWords) {
  auto bytes = fm::encode(bucket());
  bytes.pop_back();
  EXPECT_EQ(decode_error(bytes), fmt::format("manifest: message of {} bytes is not a whole "
                                             "number of 8-byte words",
                                             bytes.size()));
}

TEST(ManifestHostile, MessageLargerThanLimit) {
  const auto bytes = fm::encode(bucket());
  fm::Limits limits;
  limits.max_message_bytes = 64;
  EXPECT_EQ(decode_error(bytes, limits),
            fmt::format("manifest: message of {} bytes exceeds the limit of 64", bytes.size()));
}

TEST(ManifestHostile, GarbageBytes) {
  const std::vector<std::uint8_t> garbage(64, 0xff);
  const std::string message = decode_error(garbage);
  EXPECT_EQ(message.rfind("manifest: ", 0), 0u) << message;
  EXPECT_GT(message.size(), std::string("manifest: ").size());
}

TEST(ManifestHostile, TruncatedMessage) {
  const auto bytes = fm::encode(bucket());
  const std::vector<std::uint8_t> cut(bytes.begin(), bytes.end() - 8);
  const std::string message = decode_error(cut);
  EXPECT_NE(message.find("manifest: "), std::string::npos) << message;
  EXPECT_NE(message.find("prematurely"), std::string::npos) << message;
}

TEST(ManifestHostile, EveryTruncationIsRejected) {
  const auto bytes = fm::encode(bucket());
  for (std::size_t n = 8; n < bytes.size(); n += 8) {
    const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    EXPECT_THROW(fm::decode(cut), ferry::Error) << "prefix of " << n << " bytes";
  }
}

TEST(ManifestHostile, TrailingBytes) {
  auto bytes = fm::encode(bucket());
  bytes.resize(bytes.size() + 16, 0);
  EXPECT_EQ(decode_error(bytes), "manifest: 16 trailing bytes after the message");
}

TEST(ManifestHostile, RandomBytesNeverEscapeAsOtherErrors) {
  // Random words, and random single-byte corruptions of a valid message: decode either accepts
  // (and then the result passed validate) or throws ferry::Error CORRUPT_DATA, nothing else.
  std::mt19937_64 rng(1234);
  const auto valid = fm::encode(bucket());
  int rejected = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::uint8_t> bytes;
    if (round % 2 == 0) {
      bytes.resize(8 * (1 + rng() % 16));
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    } else {
      bytes = valid;
      bytes[rng() % bytes.size()] = static_cast<std::uint8_t>(rng());
    }
    try {
      const fm::Manifest m = fm::decode(bytes);
      EXPECT_NO_THROW(fm::validate(m));
    } catch (const ferry::Error& e) {
      EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
}

TEST(ManifestHostile, TraversalLimitExceeded) {
  fm::Limits limits;
  limits.traversal_limit_words = 16;
  const std::string message = decode_error(fm::encode(bucket()), limits);
  EXPECT_NE(message.find("traversal limit"), std::string::npos) << message;
}

TEST(ManifestHostile, NestingLimitExceeded) {
  // Manifest -> tensors -> entry -> fingerprint is the deepest path this schema has.
  fm::Manifest m = bucket();
  m.tensors[0].fingerprint = 1;
  fm::Limits limits;
  limits.nesting_limit = 1;
  const std::string message = decode_error(fm::encode(m), limits);
  EXPECT_NE(message.find("nested"), std::string::npos) << message;
  limits.nesting_limit = 16;
  EXPECT_NO_THROW(fm::decode(fm::encode(m), limits));
}

TEST(ManifestHostile, TooManyTensors) {
  fm::Limits limits;
  limits.max_tensors = 1;
  EXPECT_EQ(decode_error(fm::encode(bucket()), limits),
            "manifest: 2 tensors exceed the limit of 1");
}

TEST(ManifestHostile, TensorListOfDefaultLimitPlusOne) {
  // A list header claiming max_tensors + 1 entries must be refused before anything is copied.
  const fm::Limits limits;
  const auto bytes = raw([&](ferry::schema::Manifest::Builder m) {
    m.initTensors(static_cast<unsigned>(limits.max_tensors + 1));
  });
  EXPECT_EQ(decode_error(bytes), fmt::format("manifest: {} tensors exceed the limit of {}",
                                             limits.max_tensors + 1, limits.max_tensors));
}

TEST(ManifestHostile, NameTooLong) {
  const std::string name(2000, 'n');
  const std::string message = decode_error(raw([&](auto m) { one_tensor(m, name); }));
  EXPECT_NE(message.find("name of 2000 bytes exceeds the limit of 1024"), std::string::npos)
      << message;
  EXPECT_LT(message.size(), 300u) << "the message must not repeat the whole name";
}

TEST(ManifestHostile, EmptyName) {
  EXPECT_EQ(decode_error(raw([](auto m) { one_tensor(m, ""); })),
            "manifest: tensor '' (index 0): empty name");
}

TEST(ManifestHostile, NameWithNulByte) {
  EXPECT_EQ(decode_error(raw([](auto m) { one_tensor(m, std::string("a\0b", 3)); })),
            "manifest: tensor 'a\\x00b' (index 0): name contains a NUL byte");
}

TEST(ManifestHostile, TooManyDims) {
  const auto bytes = raw([](ferry::schema::Manifest::Builder m) {
    one_tensor(m, "deep");
    auto shape = m.getTensors()[0].initShape(FERRY_MAX_DIMS + 1);
    for (unsigned d = 0; d < FERRY_MAX_DIMS + 1; ++d) shape.set(d, 1);
  });
  EXPECT_EQ(decode_error(bytes), "manifest: tensor 'deep' (index 0): 9 dims exceed the limit of 8");
}

TEST(ManifestHostile, UnknownDtypeOrdinal) {
  const auto bytes = raw([](ferry::schema::Manifest::Builder m) {
    one_tensor(m, "w");
    m.getTensors()[0].setDtype(static_cast<ferry::schema::DType>(200));
  });
  EXPECT_EQ(decode_error(bytes), "manifest: tensor 'w' (index 0): unknown dtype ordinal 200");
}

TEST(ManifestHostile, InvalidDtype) {
  const auto bytes = raw([](ferry::schema::Manifest::Builder m) {
    one_tensor(m, "w");
    m.getTensors()[0].setDtype(ferry::schema::DType::INVALID);
  });
  EXPECT_EQ(decode_error(bytes), "manifest: tensor 'w' (index 0): unknown dtype ordinal 0");
}

TEST(ManifestHostile, UnknownScaleDtypeOrdinal) {
  const auto bytes = raw([](ferry::schema::Manifest::Builder m) {
    one_tensor(m, "w");
    m.getTensors()[0].initQuantization().setScaleDtype(static_cast<ferry::schema::DType>(77));
  });
  EXPECT_EQ(decode_error(bytes),
            "manifest: tensor 'w' (index 0): unknown quantization scale dtype ordinal 77");
}

// Another algorithm, or the one a ferry from before the fingerprint changed names: refused, named.
TEST(ManifestHostile, UnknownFingerprintAlgorithm) {
  for (const char* algorithm : {"md5", "xxh64-chunked-v1"}) {
    const auto bytes = raw([&](ferry::schema::Manifest::Builder m) {
      one_tensor(m, "w");
      auto fp = m.getTensors()[0].initFingerprint();
      fp.setAlgorithm(algorithm);
      fp.setValue(1);
    });
    EXPECT_EQ(decode_error(bytes), std::string("manifest: tensor 'w' (index 0): fingerprint "
                                               "algorithm '") +
                                       algorithm + "' is not 'xxh64-interleaved-v1'");
  }
}

TEST(ManifestHostile, OffsetPastBucket) {
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 4096;
  m.tensors.push_back(entry("x", FERRY_DTYPE_U8, {1000}, 4000));
  EXPECT_EQ(both_reject(m), "manifest: tensor 'x' (index 0): ends at 5000 past bucket of 4096 bytes");
}

TEST(ManifestHostile, OffsetPlusSizeOverflows) {
  fm::Manifest m;
  m.tensors.push_back(entry("x", FERRY_DTYPE_U8, {16}, ~0ull - 4));
  EXPECT_EQ(both_reject(m), fmt::format("manifest: tensor 'x' (index 0): offset {} + size 16 "
                                        "overflows uint64",
                                        ~0ull - 4));
}

TEST(ManifestHostile, OverlappingTensors) {
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 4096;
  m.tensors.push_back(entry("y", FERRY_DTYPE_U8, {100}, 100));
  m.tensors.push_back(entry("x", FERRY_DTYPE_U8, {150}, 150));
  EXPECT_EQ(both_reject(m),
            "manifest: tensor 'x' (index 1): byte range [150, 300) overlaps 'y' [100, 200)");
}

TEST(ManifestHostile, UnsortedOffsets) {
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 4096;
  m.tensors.push_back(entry("y", FERRY_DTYPE_U8, {8}, 64));
  m.tensors.push_back(entry("x", FERRY_DTYPE_U8, {8}, 0));
  EXPECT_EQ(both_reject(m), "manifest: tensor 'x' (index 1): offset 0 is before 'y' at 64 "
                            "(entries must be sorted by offset)");
}

TEST(ManifestHostile, GapTooLarge) {
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 1 << 20;
  m.tensors.push_back(entry("y", FERRY_DTYPE_U8, {8}, 0));
  m.tensors.push_back(entry("x", FERRY_DTYPE_U8, {8}, 8 + 5000));
  EXPECT_EQ(both_reject(m),
            "manifest: tensor 'x' (index 1): gap of 5000 bytes before 'x' exceeds 4096");
  m.tensors[1].offset = 8 + 4096;  // exactly the allowed padding
  EXPECT_NO_THROW(fm::validate(m));
}

TEST(ManifestHostile, ShapeProductOverflows) {
  fm::Manifest m;
  fm::Entry e;
  e.name = "huge";
  e.dtype = FERRY_DTYPE_F32;
  e.shape = {1ull << 32, 1ull << 31, 2};
  e.size = 0;
  m.tensors.push_back(e);
  EXPECT_EQ(both_reject(m), "manifest: tensor 'huge' (index 0): shape [4294967296, 2147483648, "
                            "2] product * 4 overflows uint64");
  // The element count fits, the byte count does not.
  m.tensors[0].shape = {1ull << 62};
  EXPECT_EQ(validate_error(m),
            "manifest: tensor 'huge' (index 0): shape [4611686018427387904] product * 4 "
            "overflows uint64");
}

TEST(ManifestHostile, SizeMismatch) {
  fm::Manifest m;
  m.tensors.push_back(entry("x", FERRY_DTYPE_F32, {2, 3}, 0));
  m.tensors[0].size = 12;
  EXPECT_EQ(both_reject(m),
            "manifest: tensor 'x' (index 0): size 12 != product(shape [2, 3]) * 4 = 24");
}

TEST(ManifestHostile, DuplicateNames) {
  fm::Manifest m = bucket();
  m.tensors[1].name = "a";
  EXPECT_EQ(both_reject(m), "manifest: tensor 'a' (index 1): duplicate name (first at index 0)");
}

TEST(ManifestHostile, BucketIndexOutOfRange) {
  fm::Manifest m = bucket();
  m.bucket_index = 3;
  m.bucket_count = 2;
  EXPECT_EQ(both_reject(m), "manifest: bucket_index 3 >= bucket_count 2");
}

TEST(ManifestHostile, ShardIndexOutOfRange) {
  fm::Manifest m = bucket();
  m.tensors[0].sharding = fm::Sharding{1, 4, 4};
  EXPECT_EQ(validate_error(m), "manifest: tensor 'a' (index 0): sharding index 4 >= count 4");
  m.tensors[0].sharding = fm::Sharding{2, 0, 4};
  EXPECT_EQ(validate_error(m), "manifest: tensor 'a' (index 0): sharding dim 2 >= ndim 2");
}

TEST(ManifestHostile, SmallerLimitsApplyToValidate) {
  fm::Limits limits;
  limits.max_name_bytes = 0;
  EXPECT_EQ(validate_error(bucket(), limits),
            "manifest: tensor 'a' (index 0): name of 1 bytes exceeds the limit of 0");
  limits = {};
  limits.max_dims = 1;
  EXPECT_EQ(validate_error(bucket(), limits),
            "manifest: tensor 'a' (index 0): 2 dims exceed the limit of 1");
}

// ---- signature and tensor descriptors -------------------------------------------------------

TEST(ManifestSignature, IgnoresOffsetsFingerprintsAndVersions) {
  const fm::Manifest a = bucket();
  fm::Manifest b = bucket();
  b.version = 99;
  b.version_label = "other";
  b.bucket_index = 2;
  b.tensors[1].offset = 24;
  b.tensors[0].fingerprint = 42;
  EXPECT_EQ(fm::signature(a), fm::signature(b));
}

TEST(ManifestSignature, ChangesWithNameDtypeShapeAndOrder) {
  const fm::Manifest base = bucket();
  const std::uint64_t s = fm::signature(base);
  fm::Manifest m = base;
  m.tensors[0].name = "c";
  EXPECT_NE(fm::signature(m), s);
  m = base;
  m.tensors[0].dtype = FERRY_DTYPE_I32;
  EXPECT_NE(fm::signature(m), s);
  m = base;
  m.tensors[0].shape = {3, 2};
  EXPECT_NE(fm::signature(m), s);
  m = base;
  std::swap(m.tensors[0], m.tensors[1]);
  EXPECT_NE(fm::signature(m), s);
  // Length prefixes keep name boundaries apart.
  fm::Manifest x;
  x.tensors = {entry("ab", FERRY_DTYPE_U8, {1}, 0), entry("c", FERRY_DTYPE_U8, {1}, 1)};
  fm::Manifest y;
  y.tensors = {entry("a", FERRY_DTYPE_U8, {1}, 0), entry("bc", FERRY_DTYPE_U8, {1}, 1)};
  EXPECT_NE(fm::signature(x), fm::signature(y));
}

TEST(ManifestSignature, IsStableAcrossBuilds) {
  // Pinned: plans cached by signature must keep matching after a rebuild or on another host.
  // Values computed independently: FNV-1a 64 over little-endian u64 count, then per entry
  // u64 name length, name bytes, u64 dtype, u64 ndim, u64 dims.
  EXPECT_EQ(fm::signature(fm::Manifest{}), 0xa8c7f832281a39c5ull);
  EXPECT_EQ(fm::signature(bucket()), 0xdacd3a36377d9068ull);
  EXPECT_EQ(fm::signature(bucket()), fm::signature(fm::decode(fm::encode(bucket()))));
}

TEST(ManifestDescs, PointIntoTheManifest) {
  const fm::Manifest m = bucket();
  const auto descs = fm::tensor_descs(m);
  ASSERT_EQ(descs.size(), 2u);
  EXPECT_EQ(descs[0].struct_size, FERRY_STRUCT_SIZE(ferry_tensor_desc_t, shape));
  EXPECT_EQ(descs[0].name, m.tensors[0].name.c_str());
  EXPECT_STREQ(descs[1].name, "b");
  EXPECT_EQ(descs[0].dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(descs[0].ndim, 2u);
  EXPECT_EQ(descs[0].shape[0], 2u);
  EXPECT_EQ(descs[0].shape[1], 3u);
  EXPECT_EQ(descs[0].shape[2], 0u);
  EXPECT_EQ(descs[1].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(descs[1].ndim, 1u);
  EXPECT_EQ(descs[1].shape[0], 8u);
}

TEST(ManifestDescs, RefusesMoreDimsThanTheAbiHolds) {
  fm::Manifest m;
  m.tensors.push_back(entry("deep", FERRY_DTYPE_U8, std::vector<std::uint64_t>(9, 1), 0));
  EXPECT_THROW(fm::tensor_descs(m), ferry::Error);
}

// A block of a global tensor (a sharded sender's piece) round-trips, is validated against its
// global shape, and plans apart from a whole tensor of the same shape.
TEST(ManifestBlock, RoundTripsAndIsValidatedAgainstItsGlobalShape) {
  namespace fm = ferry::manifest;
  fm::Manifest m;
  m.bucket_count = 1;
  m.bucket_bytes = 64;
  fm::Entry e;
  e.name = "w";
  e.dtype = FERRY_DTYPE_F32;
  e.shape = {4, 4};
  e.size = 64;
  fm::Manifest whole = m;
  whole.tensors.push_back(e);
  e.block = fm::Block{{8, 4}, {4, 0}};
  m.tensors.push_back(e);
  const auto decoded = fm::decode(fm::encode(m));
  ASSERT_TRUE(decoded.tensors[0].block.has_value());
  EXPECT_EQ(decoded.tensors[0].block->global_shape, (std::vector<std::uint64_t>{8, 4}));
  EXPECT_EQ(decoded.tensors[0].block->offsets, (std::vector<std::uint64_t>{4, 0}));
  EXPECT_NE(fm::signature(m), fm::signature(whole));
  m.tensors[0].block->offsets = {5, 0};
  try {
    fm::validate(m);
    FAIL() << "no error";
  } catch (const ferry::Error& err) {
    EXPECT_NE(std::string(err.what()).find("block [5, +4) on dim 0 lies outside the global shape "
                                           "[8, 4]"),
              std::string::npos)
        << err.what();
  }
}
