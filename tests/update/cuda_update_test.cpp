// Tests of the update engine on CUDA memory (a real device): updates into the CUDA weight store
// are bit-identical to the same updates into the CPU store, from pageable, page-locked and device
// buckets; repeated updates reuse the cached plan and device op table; a failed update rolls back
// on the device, also right after a commit whose mirror refresh runs in the background; a CUDA
// graph over the weights replays correctly after release/resume and after an update; 100
// release/resume cycles with updates leak no device or page-locked memory. Exits 77 (meson's skip
// code) without a CUDA device.
#include "store/cpu_weight_store.hpp"
#include "store/cuda_weight_store.hpp"
#include "update/param_fingerprint.hpp"
#include "update/update_engine.hpp"

#include <ferry/kernels/cpu.hpp>

#include "../store/cuda_graph_kernel.hpp"
#include "update_fixture.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::update {
namespace {

using testing::IdentityPlans;
using testing::make_bucket;
using testing::random_weights;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr std::uint64_t kMiB = 1ull << 20;

// Many small tensors of several dtypes (odd sizes included) and two large ones.
std::vector<LayoutParam> mixed_layout() {
  std::vector<LayoutParam> layout;
  const ferry_dtype_t dtypes[] = {FERRY_DTYPE_BF16, FERRY_DTYPE_F32, FERRY_DTYPE_F16,
                                  FERRY_DTYPE_I8, FERRY_DTYPE_I64};
  for (std::uint64_t i = 0; i < 300; ++i) {
    layout.push_back({"small." + std::to_string(i), dtypes[i % 5], {1 + (i * 37) % 129, 3}});
  }
  layout.push_back({"big.0", FERRY_DTYPE_BF16, {4096, 2048}});  // 16 MiB
  layout.push_back({"big.1", FERRY_DTYPE_F32, {1000, 999}});
  return layout;
}

std::vector<std::string> names_of(const std::vector<LayoutParam>& layout, std::size_t begin,
                                  std::size_t end) {
  std::vector<std::string> names;
  for (std::size_t i = begin; i < end && i < layout.size(); ++i) names.push_back(layout[i].name);
  return names;
}

// The checkpoint of `version` cut into three buckets.
std::vector<testing::Bucket> buckets_for(const std::vector<LayoutParam>& layout,
                                         std::uint64_t version) {
  const auto weights = random_weights(layout, version);
  const std::size_t n = layout.size();
  return {make_bucket(layout, weights, names_of(layout, 0, 150), version, 0, 3),
          make_bucket(layout, weights, names_of(layout, 150, n - 1), version, 1, 3),
          make_bucket(layout, weights, names_of(layout, n - 1, n), version, 2, 3)};
}

std::vector<store::TensorSpec> specs_of(const std::vector<LayoutParam>& layout) {
  std::vector<store::TensorSpec> specs;
  for (const auto& p : layout) specs.push_back({p.name, p.dtype, p.shape});
  return specs;
}

std::vector<std::byte> read_param(const store::WeightStore& store, const std::string& name) {
  const auto info = store.param(std::string_view(name));
  std::vector<std::byte> out(info.bytes);
  store.read(*store.find(name), 0, out);
  return out;
}

// Fills every byte of the store's device regions with 0xA5 so an unwritten byte shows.
void poison(store::WeightStore& store) {
  for (std::size_t i = 0; i < store.param_count(); ++i) {
    const auto info = store.param(i);
    ASSERT_CUDA(cudaMemset(info.data, 0xA5, info.bytes));
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
}

enum class Source { pageable, staging, device };

// Applies `buckets` as update `version`, from the given kind of memory.
void apply(UpdateEngine& engine, std::uint64_t version,
           const std::vector<testing::Bucket>& buckets, Source source) {
  engine.begin(version, "v" + std::to_string(version));
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const auto& b = buckets[k];
    const auto manifest = b.encoded();
    if (source == Source::pageable) {
      engine.apply_bucket(b.bytes, manifest);
    } else if (source == Source::staging) {
      auto staging = engine.host_staging(static_cast<int>(k % 2), b.bytes.size());
      std::memcpy(staging.data(), b.bytes.data(), b.bytes.size());
      engine.apply_bucket(staging.first(b.bytes.size()), manifest, FERRY_MEMORY_PINNED);
    } else {
      void* device = nullptr;
      ASSERT_CUDA(cudaMalloc(&device, std::max<std::size_t>(b.bytes.size(), 1)));
      ASSERT_CUDA(cudaMemcpy(device, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice));
      engine.apply_bucket({static_cast<const std::byte*>(device), b.bytes.size()}, manifest,
                          FERRY_MEMORY_CUDA);
      ASSERT_CUDA(cudaFree(device));
    }
  }
  engine.commit();
}

class CudaUpdate : public ::testing::Test {
 protected:
  void SetUp() override {
    layout = mixed_layout();
    cpu_store.place_all("weights", store::Policy::Backup, specs_of(layout));
    cuda_store.place_all("weights", store::Policy::Backup, specs_of(layout));
    poison(cuda_store);
  }

  std::vector<LayoutParam> layout;
  store::CpuWeightStore cpu_store;
  store::CudaWeightStore cuda_store;
};

TEST_F(CudaUpdate, DeviceParametersAreBitIdenticalToTheCpuReceiverFromEveryBucketMemory) {
  IdentityPlans cpu_plans(layout);
  IdentityPlans cuda_plans(layout);
  UpdateEngine cpu_engine(cpu_store, cpu_plans);
  UpdateEngine cuda_engine(cuda_store, cuda_plans);
  std::uint64_t version = 1;
  for (Source source : {Source::pageable, Source::staging, Source::device}) {
    const auto buckets = buckets_for(layout, version);
    apply(cpu_engine, version, buckets, Source::pageable);
    apply(cuda_engine, version, buckets, source);
    for (const auto& p : layout) {
      ASSERT_EQ(read_param(cuda_store, p.name), read_param(cpu_store, p.name))
          << p.name << " after version " << version;
    }
    EXPECT_EQ(cuda_engine.fingerprints(), cpu_engine.fingerprints());
    EXPECT_EQ(cuda_engine.version().number, version);
    EXPECT_TRUE(cuda_engine.health().ready) << cuda_engine.health().reason;
    ++version;
  }
  // Fingerprints computed on the device equal the CPU twin's.
  for (const auto& p : layout) {
    EXPECT_EQ(fingerprint_param(cuda_store.param(std::string_view(p.name))),
              fingerprint_param(cpu_store.param(std::string_view(p.name))))
        << p.name;
  }
}

TEST_F(CudaUpdate, RepeatedUpdatesReuseTheCachedPlanAndStayCorrect) {
  IdentityPlans plans(layout);
  UpdateEngine engine(cuda_store, plans);
  for (std::uint64_t version = 1; version <= 4; ++version) {
    const auto buckets = buckets_for(layout, version);
    apply(engine, version, buckets, Source::staging);
    const auto weights = random_weights(layout, version);
    for (const auto& p : layout) {
      const auto& want = weights.at(p.name);
      ASSERT_EQ(read_param(cuda_store, p.name),
                std::vector<std::byte>(want.begin(), want.end()))
          << p.name << " in version " << version;
    }
  }
  EXPECT_EQ(plans.calls, 3);  // one plan per bucket shape, computed once
  EXPECT_EQ(engine.metrics().plan_cache_hits, 9u);
}

TEST_F(CudaUpdate, FailedUpdateRollsTheDeviceWeightsBackFromTheMirror) {
  IdentityPlans plans(layout);
  UpdateEngine engine(cuda_store, plans);
  apply(engine, 1, buckets_for(layout, 1), Source::pageable);
  auto bad = buckets_for(layout, 2);
  // The last bucket's bytes no longer match its manifest fingerprint: refused after two buckets
  // were written into the live weights.
  bad[2].bytes[0] ^= std::byte{1};
  engine.begin(2, "v2");
  engine.apply_bucket(bad[0].bytes, bad[0].encoded());
  engine.apply_bucket(bad[1].bytes, bad[1].encoded());
  const auto error =
      testing::error_of([&] { engine.apply_bucket(bad[2].bytes, bad[2].encoded()); });
  EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_EQ(engine.version().number, 1u);
  EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  EXPECT_EQ(engine.metrics().rollbacks, 1u);
  const auto weights = random_weights(layout, 1);
  for (const auto& p : layout) {
    const auto& want = weights.at(p.name);
    ASSERT_EQ(read_param(cuda_store, p.name), std::vector<std::byte>(want.begin(), want.end()))
        << p.name;
  }
}

// Reads in place from device memory ([one-pass]): each entry lies in device memory of its own
// (the sender's tensors as the receiver maps them), each bucket is fingerprinted on the apply
// stream right before its plan and compared once both are done: at once, or, for a source that
// keeps the bytes readable until the commit (a session), at the commit, nothing waited for
// before; the weights equal the CPU twin's either way. An entry whose bytes are not the
// manifest's (in the first bucket) fails the update after its plan wrote, naming the tensor: at
// that bucket, or at the commit once every later bucket's plan wrote too; the engine rolls the
// weights back from the mirror.
TEST_F(CudaUpdate, BucketsReadInPlaceFromDeviceMemoryAreVerifiedAsTheyAreApplied) {
  IdentityPlans cpu_plans(layout);
  IdentityPlans cuda_plans(layout);
  UpdateOptions at_commit;
  at_commit.mirror_refresh = MirrorRefreshMode::commit;  // the rollback's source is certain
  UpdateEngine cpu_engine(cpu_store, cpu_plans);
  UpdateEngine cuda_engine(cuda_store, cuda_plans, at_commit);
  std::vector<void*> memory;
  // Version `version`'s buckets read in place; with `corrupt`, the first entry of the first
  // bucket has one byte changed. Returns the error of the failing call (or none) and the
  // buckets applied before it.
  std::size_t applied = 0;
  auto read_in_place = [&](std::uint64_t version, bool corrupt,
                           bool until_commit) -> std::optional<Error> {
    applied = 0;
    const auto buckets = buckets_for(layout, version);
    cuda_engine.begin(version, "read");
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const auto& b = buckets[k];
      Bucket bucket;
      bucket.manifest_bytes = b.encoded();
      bucket.kind = FERRY_MEMORY_CUDA;
      bucket.readable_until_commit = until_commit;
      for (std::size_t i = 0; i < b.manifest.tensors.size(); ++i) {
        const auto& e = b.manifest.tensors[i];
        void* d = nullptr;
        EXPECT_EQ(cudaMalloc(&d, e.size + 512), cudaSuccess);
        memory.push_back(d);
        auto* first = static_cast<std::byte*>(d) + 16 * (k + 1);  // not where a bucket would be
        std::vector<std::byte> bytes(b.bytes.begin() + e.offset,
                                     b.bytes.begin() + e.offset + e.size);
        if (corrupt && k == 0 && i == 0) bytes.at(0) ^= std::byte{1};
        EXPECT_EQ(cudaMemcpy(first, bytes.data(), e.size, cudaMemcpyHostToDevice), cudaSuccess);
        bucket.entry_data.push_back(first);
      }
      try {
        cuda_engine.apply(bucket);
      } catch (const Error& error) {
        return error;
      }
      ++applied;
    }
    try {
      cuda_engine.commit();
    } catch (const Error& error) {
      return error;
    }
    return std::nullopt;
  };
  apply(cpu_engine, 1, buckets_for(layout, 1), Source::pageable);
  apply(cuda_engine, 1, buckets_for(layout, 1), Source::pageable);
  for (std::uint64_t version = 2; version <= 3; ++version) {
    apply(cpu_engine, version, buckets_for(layout, version), Source::pageable);
    const auto error = read_in_place(version, false, version == 3);
    ASSERT_FALSE(error) << error->what();
    for (const auto& p : layout) {
      ASSERT_EQ(read_param(cuda_store, p.name), read_param(cpu_store, p.name))
          << p.name << " after version " << version;
    }
    EXPECT_EQ(cuda_engine.fingerprints(), cpu_engine.fingerprints());
  }
  const auto v4 = buckets_for(layout, 4);
  ASSERT_GT(v4.size(), 1u);
  for (const bool until_commit : {true, false}) {
    SCOPED_TRACE(until_commit ? "compared at the commit" : "compared at the bucket");
    const auto error = read_in_place(4, true, until_commit);
    ASSERT_TRUE(error);
    EXPECT_EQ(applied, until_commit ? v4.size() : 0u);
    EXPECT_EQ(error->code(), FERRY_STATUS_CORRUPT_DATA) << error->what();
    EXPECT_NE(std::string(error->what()).find(v4.front().manifest.tensors[0].name),
              std::string::npos)
        << error->what();
    EXPECT_NE(std::string(error->what()).find("read in place"), std::string::npos) << error->what();
    EXPECT_EQ(cuda_engine.version().number, 3u);
    EXPECT_TRUE(cuda_engine.health().ready) << cuda_engine.health().reason;
    for (const auto& p : layout) {
      ASSERT_EQ(read_param(cuda_store, p.name), read_param(cpu_store, p.name)) << p.name;
    }
  }
  EXPECT_EQ(cuda_engine.metrics().rollbacks, 2u);
  for (void* d : memory) EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// The CUDA store's background refresh of the page-locked mirror with memory.mirror_refresh =
// "complete": commit returns while the device-to-host copy may still run; the next update's begin
// waits for it, so a failure right after a commit rolls the device weights back to exactly the
// version just published; a release right after a commit resumes exactly it. With "commit" the
// mirror holds the version when commit returns. (The default, "background", lets such an update
// pre-empt the copy: update_engine_test covers it.)
TEST_F(CudaUpdate, BackgroundMirrorRefreshIsWhatAFailureRightAfterTheCommitRollsBackTo) {
  IdentityPlans plans(layout);
  UpdateOptions complete;
  complete.mirror_refresh = MirrorRefreshMode::complete;
  UpdateEngine engine(cuda_store, plans, complete);
  auto expect_weights = [&](std::uint64_t version, const char* when) {
    const auto weights = random_weights(layout, version);
    for (const auto& p : layout) {
      const auto& want = weights.at(p.name);
      ASSERT_EQ(read_param(cuda_store, p.name), std::vector<std::byte>(want.begin(), want.end()))
          << p.name << " " << when;
    }
  };
  const auto v1 = buckets_for(layout, 1);
  const auto v2 = buckets_for(layout, 2);
  auto bad = buckets_for(layout, 3);
  bad[2].bytes[0] ^= std::byte{1};  // refused after two buckets were written in place
  apply(engine, 1, v1, Source::staging);
  apply(engine, 2, v2, Source::staging);
  engine.begin(3, "v3");  // right after the commit of version 2
  engine.apply_bucket(bad[0].bytes, bad[0].encoded());
  engine.apply_bucket(bad[1].bytes, bad[1].encoded());
  EXPECT_EQ(testing::error_of([&] { engine.apply_bucket(bad[2].bytes, bad[2].encoded()); }).code(),
            FERRY_STATUS_CORRUPT_DATA);
  EXPECT_EQ(engine.version().number, 2u);
  EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  EXPECT_EQ(engine.metrics().rollbacks, 1u);
  expect_weights(2, "after the rollback");

  const auto v4 = buckets_for(layout, 4);
  apply(engine, 4, v4, Source::device);
  const std::vector<std::string> tags{"weights"};
  cuda_store.release(tags);  // right after the commit of version 4
  cuda_store.resume(tags);
  expect_weights(4, "after release and resume");
  EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  const auto state = cuda_store.wait_for_mirror_refresh();
  EXPECT_FALSE(state.failed) << state.error;
  EXPECT_EQ(state.version, 4u);
  EXPECT_EQ(state.finished, 3u);  // versions 1, 2 and 4
  ASSERT_TRUE(cuda_store.mirror()->committed().has_value());
  EXPECT_EQ(cuda_store.mirror()->committed()->number, 4u);
  EXPECT_GT(cuda_store.pinned_mirror_bytes(), 0u);

  // "commit": the mirror holds version 5, byte for byte, when commit returns.
  UpdateOptions at_commit;
  at_commit.mirror_refresh = MirrorRefreshMode::commit;
  IdentityPlans commit_plans(layout);
  UpdateEngine commit_engine(cuda_store, commit_plans, at_commit);
  apply(commit_engine, 5, buckets_for(layout, 5), Source::pageable);
  const auto now = cuda_store.mirror_refresh_state();  // no wait
  EXPECT_FALSE(now.running);
  EXPECT_FALSE(now.failed) << now.error;
  EXPECT_EQ(now.version, 5u);
  const auto mirror = cuda_store.mirror();
  ASSERT_TRUE(mirror->committed().has_value());
  EXPECT_EQ(mirror->committed()->number, 5u);
  const auto weights = random_weights(layout, 5);
  for (const auto& p : layout) {
    const auto entry = mirror->find(p.name).value();
    const std::byte* slot = mirror->slot(entry);
    const auto& want = weights.at(p.name);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), slot, slot + mirror->entries()[entry].bytes))
        << p.name;
  }
}

// Direct delivery on the device: a peer (here cudaMemcpy) writes each tensor into the
// destination the engine gave; commit fingerprints what was written in one pass, checks it
// against the manifests, and one wrong byte written in place is caught and rolled back.
TEST_F(CudaUpdate, InPlaceWritesAreVerifiedAndAWrongByteRollsBack) {
  IdentityPlans plans(layout);
  UpdateEngine engine(cuda_store, plans);
  apply(engine, 1, buckets_for(layout, 1), Source::pageable);
  const auto descs = testing::descs_of(layout);
  const auto dests = engine.direct_destinations(descs);
  ASSERT_EQ(dests.size(), layout.size());
  std::map<std::string, UpdateEngine::DirectDestination> where;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    ASSERT_TRUE(dests[i].has_value()) << layout[i].name;
    EXPECT_EQ(dests[i]->data, cuda_store.param(std::string_view(layout[i].name)).data);
    EXPECT_GE(dests[i]->data, dests[i]->block);
    where[layout[i].name] = *dests[i];
  }
  // Writes bucket `b`'s tensors in place (flipping one byte of the first when `corrupt`).
  auto write = [&](const testing::Bucket& b, bool corrupt) {
    for (const auto& e : b.manifest.tensors) {
      std::vector<std::byte> bytes(b.bytes.begin() + static_cast<std::ptrdiff_t>(e.offset),
                                   b.bytes.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size));
      if (corrupt && &e == &b.manifest.tensors.front()) bytes[0] ^= std::byte{1};
      ASSERT_CUDA(cudaMemcpy(where.at(e.name).data, bytes.data(), bytes.size(),
                             cudaMemcpyHostToDevice));
    }
  };
  const auto v2 = buckets_for(layout, 2);
  engine.begin(2, "v2");
  engine.begin_direct_writes();
  for (const auto& b : v2) {
    write(b, false);
    engine.record_direct_bucket(b.encoded());
  }
  engine.commit();
  const auto weights = random_weights(layout, 2);
  for (const auto& p : layout) {
    const auto& want = weights.at(p.name);
    ASSERT_EQ(read_param(cuda_store, p.name), std::vector<std::byte>(want.begin(), want.end()))
        << p.name;
    EXPECT_EQ(engine.fingerprints().at(p.name), kernels::fingerprint_cpu(want.data(), want.size()))
        << p.name;
  }
  // Version 3: every bucket written, one wrong byte in bucket 1: the commit refuses it.
  const auto v3 = buckets_for(layout, 3);
  engine.begin(3, "v3");
  engine.begin_direct_writes();
  for (std::size_t k = 0; k < v3.size(); ++k) {
    write(v3[k], k == 1);
    engine.record_direct_bucket(v3[k].encoded());
  }
  const auto error = testing::error_of([&] { engine.commit(); });
  EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA);
  EXPECT_NE(std::string(error.what()).find(v3[1].manifest.tensors.front().name), std::string::npos)
      << error.what();
  EXPECT_EQ(engine.version().number, 2u);
  EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  for (const auto& p : layout) {
    const auto& want = weights.at(p.name);
    ASSERT_EQ(read_param(cuda_store, p.name), std::vector<std::byte>(want.begin(), want.end()))
        << p.name << " after the rollback";
  }
}

// Direct delivery whose manifests carry the writing copy's fingerprints (cuda_ipc's fused copy
// kernel): trusted (update.direct_verify = "writer", the default) the commit reads nothing back
// and publishes the writer's fingerprints; with "reread" it reads what was written and a byte
// that differs from what the writer hashed is caught and rolled back.
TEST_F(CudaUpdate, WriterFingerprintsAreTakenWhenTrustedAndRereadOtherwise) {
  const auto descs = testing::descs_of(layout);
  const auto v2 = buckets_for(layout, 2);
  const auto weights = random_weights(layout, 2);
  for (const bool trusted : {true, false}) {
    SCOPED_TRACE(trusted ? "writer fingerprints trusted" : "reread");
    IdentityPlans plans(layout);
    UpdateOptions options;
    options.trust_writer_fingerprints = trusted;
    UpdateEngine engine(cuda_store, plans, options);
    apply(engine, 1, buckets_for(layout, 1), Source::pageable);
    const auto dests = engine.direct_destinations(descs);
    std::map<std::string, std::byte*> where;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      ASSERT_TRUE(dests[i].has_value()) << layout[i].name;
      where[layout[i].name] = dests[i]->data;
    }
    engine.begin(2, "v2");
    engine.begin_direct_writes(/*writer_fingerprints=*/true);
    for (std::size_t k = 0; k < v2.size(); ++k) {
      for (const auto& e : v2[k].manifest.tensors) {
        std::vector<std::byte> bytes(
            v2[k].bytes.begin() + static_cast<std::ptrdiff_t>(e.offset),
            v2[k].bytes.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size));
        // One byte lands other than the writer hashed it (first tensor of bucket 1).
        if (k == 1 && &e == &v2[k].manifest.tensors.front()) bytes[0] ^= std::byte{1};
        ASSERT_CUDA(cudaMemcpy(where.at(e.name), bytes.data(), bytes.size(),
                               cudaMemcpyHostToDevice));
      }
      engine.record_direct_bucket(v2[k].encoded());
    }
    if (trusted) {
      engine.commit();
      EXPECT_EQ(engine.version().number, 2u);
      for (const auto& p : layout) {
        const auto& want = weights.at(p.name);
        EXPECT_EQ(engine.fingerprints().at(p.name),
                  kernels::fingerprint_cpu(want.data(), want.size()))
            << p.name << ": the writer's fingerprint is published";
      }
    } else {
      const auto error = testing::error_of([&] { engine.commit(); });
      EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA) << error.what();
      EXPECT_EQ(engine.version().number, 1u);
      EXPECT_TRUE(engine.health().ready) << engine.health().reason;
    }
  }
}

// Writer fingerprints that come with the Commit (the session's Begin.fingerprintsAtCommit):
// bucket manifests without fingerprints are recorded, then the prints are attached in recording
// order. Attached right, they are published (trusted) or checked against a reread (one wrong
// byte caught); missing, or of the wrong count, the update fails and version 1 stays.
TEST_F(CudaUpdate, FingerprintsThatComeWithTheCommitAreCheckedAndRequired) {
  const auto descs = testing::descs_of(layout);
  const auto v2 = buckets_for(layout, 2);
  const auto weights = random_weights(layout, 2);
  enum class Case { attached, attached_reread_wrong_byte, missing, wrong_count };
  for (const Case c : {Case::attached, Case::attached_reread_wrong_byte, Case::missing,
                       Case::wrong_count}) {
    SCOPED_TRACE(static_cast<int>(c));
    IdentityPlans plans(layout);
    UpdateOptions options;
    options.trust_writer_fingerprints = c != Case::attached_reread_wrong_byte;
    UpdateEngine engine(cuda_store, plans, options);
    apply(engine, 1, buckets_for(layout, 1), Source::pageable);
    const auto dests = engine.direct_destinations(descs);
    engine.begin(2, "v2");
    engine.begin_direct_writes(/*writer_fingerprints=*/true);
    std::vector<std::uint64_t> prints;
    for (std::size_t k = 0; k < v2.size(); ++k) {
      auto without = v2[k].manifest;
      for (auto& e : without.tensors) {
        prints.push_back(*e.fingerprint);
        e.fingerprint.reset();
        std::vector<std::byte> bytes(
            v2[k].bytes.begin() + static_cast<std::ptrdiff_t>(e.offset),
            v2[k].bytes.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size));
        if (c == Case::attached_reread_wrong_byte && k == 1 && &e == &without.tensors.front()) {
          bytes[0] ^= std::byte{1};
        }
        std::size_t at = 0;
        while (layout[at].name != e.name) ++at;
        ASSERT_CUDA(cudaMemcpy(dests[at]->data, bytes.data(), bytes.size(),
                               cudaMemcpyHostToDevice));
      }
      ferry::update::Bucket in_place;  // decoded already: as the update loop hands it over
      in_place.in_place = true;
      in_place.manifest = without;
      engine.apply(in_place);
    }
    if (c == Case::attached) {
      engine.attach_direct_fingerprints(prints);
      engine.commit();
      EXPECT_EQ(engine.version().number, 2u);
      for (const auto& p : layout) {
        const auto& want = weights.at(p.name);
        EXPECT_EQ(engine.fingerprints().at(p.name),
                  kernels::fingerprint_cpu(want.data(), want.size()))
            << p.name;
      }
      continue;
    }
    Error error(FERRY_STATUS_OK, "");
    if (c == Case::wrong_count) {
      prints.pop_back();
      error = testing::error_of([&] { engine.attach_direct_fingerprints(prints); });
      EXPECT_NE(std::string(error.what()).find("writer fingerprints for"), std::string::npos)
          << error.what();
    } else {
      if (c == Case::attached_reread_wrong_byte) engine.attach_direct_fingerprints(prints);
      error = testing::error_of([&] { engine.commit(); });
      if (c == Case::missing) {
        EXPECT_NE(std::string(error.what()).find("without a fingerprint"), std::string::npos)
            << error.what();
      }
    }
    EXPECT_EQ(error.code(), FERRY_STATUS_CORRUPT_DATA) << error.what();
    EXPECT_EQ(engine.version().number, 1u);
    EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  }
}

// The wrapping sum of the 32-bit words of `bytes` (what the graph kernel computes).
unsigned long long word_sum(const std::vector<std::byte>& bytes) {
  unsigned long long sum = 0;
  for (std::size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    std::uint32_t w = 0;
    std::memcpy(&w, bytes.data() + i, 4);
    sum += w;
  }
  return sum;
}

TEST_F(CudaUpdate, CapturedGraphReplaysEqualToEagerAfterReleaseResumeAndAfterAnUpdate) {
  IdentityPlans plans(layout);
  UpdateEngine engine(cuda_store, plans);
  apply(engine, 1, buckets_for(layout, 1), Source::pageable);
  const auto big = cuda_store.param(std::string_view("big.0"));
  const std::uint64_t words = big.bytes / 4;
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned long long* out = nullptr;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&out), 2 * sizeof(unsigned long long)));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA(store::testing::enqueue_word_sum(big.data, words, out, stream));
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  auto replay_and_eager = [&](unsigned long long& replayed, unsigned long long& eager) {
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaMemcpyAsync(&replayed, out, sizeof replayed, cudaMemcpyDeviceToHost, stream));
    ASSERT_CUDA(store::testing::enqueue_word_sum(big.data, words, out + 1, stream));
    ASSERT_CUDA(cudaMemcpyAsync(&eager, out + 1, sizeof eager, cudaMemcpyDeviceToHost, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
  };
  const auto v1 = random_weights(layout, 1).at("big.0");
  const unsigned long long v1_sum = word_sum(v1);
  unsigned long long replayed = 0, eager = 0;
  replay_and_eager(replayed, eager);
  EXPECT_EQ(replayed, v1_sum);
  EXPECT_EQ(eager, v1_sum);

  const std::vector<std::string> tags{"weights"};
  cuda_store.release(tags);
  cuda_store.resume(tags);  // backup: the same bytes at the same address
  ASSERT_EQ(cuda_store.param(std::string_view("big.0")).data, big.data);
  replay_and_eager(replayed, eager);
  EXPECT_EQ(replayed, v1_sum);
  EXPECT_EQ(eager, v1_sum);

  apply(engine, 2, buckets_for(layout, 2), Source::staging);
  const auto v2 = random_weights(layout, 2).at("big.0");
  const unsigned long long v2_sum = word_sum(v2);
  ASSERT_NE(v2_sum, v1_sum);
  replay_and_eager(replayed, eager);
  EXPECT_EQ(replayed, v2_sum);
  EXPECT_EQ(eager, v2_sum);

  ASSERT_CUDA(cudaGraphExecDestroy(exec));
  ASSERT_CUDA(cudaGraphDestroy(graph));
  ASSERT_CUDA(cudaFree(out));
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

std::uint64_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

std::uint64_t free_device_bytes() {
  std::size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

TEST_F(CudaUpdate, HundredReleaseResumeCyclesWithUpdatesLeakNoDeviceOrPinnedMemory) {
  IdentityPlans plans(layout);
  UpdateEngine engine(cuda_store, plans);
  const std::vector<std::string> tags{"weights"};
  // Warm up: the mirror, the staging buckets and the plan cache exist before measuring.
  apply(engine, 1, buckets_for(layout, 1), Source::staging);
  cuda_store.release(tags);
  cuda_store.resume(tags);
  auto later = buckets_for(layout, 2);
  for (auto& b : later) b.manifest.version = 0;  // applied again as updates 3, 13, ...
  apply(engine, 2, later, Source::staging);
  const std::uint64_t free_before = free_device_bytes();
  const std::uint64_t rss_before = status_kib("VmRSS");
  const std::uint64_t locked_before = status_kib("VmLck") + status_kib("VmPin");
  for (std::uint64_t cycle = 0; cycle < 100; ++cycle) {
    cuda_store.release(tags);
    cuda_store.resume(tags);
    if (cycle % 10 == 0) apply(engine, 3 + cycle, later, Source::staging);
  }
  EXPECT_TRUE(engine.health().ready) << engine.health().reason;
  const auto weights = random_weights(layout, 2);
  for (const auto& p : layout) {
    const auto& want = weights.at(p.name);
    ASSERT_EQ(read_param(cuda_store, p.name), std::vector<std::byte>(want.begin(), want.end()))
        << p.name;
  }
  const std::uint64_t free_after = free_device_bytes();
  const std::uint64_t slack = 64 * kMiB;  // allocator granularity, not a per-cycle leak
  EXPECT_LE(free_before, free_after + slack) << "device memory shrank over 100 cycles";
  EXPECT_EQ(status_kib("VmLck") + status_kib("VmPin"), locked_before);
  EXPECT_LE(status_kib("VmRSS"), rss_before + 64 * 1024) << "RSS grew by more than 64 MiB";
}

}  // namespace
}  // namespace ferry::update
