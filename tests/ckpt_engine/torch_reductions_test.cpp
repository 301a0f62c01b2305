// tests/ckpt_engine/torch_reductions_test.cpp: <ferry/formats/torch_reductions.hpp>, shared by
// checkpoint-engine's decoder and SGLang's /update_weights_from_tensor: a real torch 2.11 CUDA
// IPC reduction (fixture) decodes; SGLang's patched rebuild carries the device as a UUID; a
// tensor that does not fit its storage is refused; the consumer's release decrements exactly its
// slot of torch's reference-count file (and a missing file is no error).
#include <gtest/gtest.h>
#include <ferry/formats/torch_reductions.hpp>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "pickle_bytes.hpp"

namespace ferry::torch_reductions {
namespace {

using ckpt_engine::read_pickle;
using ckpt_engine::testing::PickleBytes;

std::vector<std::uint8_t> fixture(const std::string& name) {
  std::ifstream in(std::filesystem::path(FERRY_CKPT_FIXTURE_DIR) / (name + ".pickle"),
                   std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A rebuild call of a float32 [4, 4] CUDA tensor named by `callee`, device `device` (pickle
// bytes), storage of `storage_bytes`.
std::vector<std::uint8_t> cuda_call(std::string_view module, std::string_view name,
                                    const std::function<void(PickleBytes&)>& device,
                                    std::int64_t storage_bytes) {
  PickleBytes p;
  p.global(module, name).mark();
  p.global("torch", "Tensor").size({4, 4}).integer(4).integer(1).op(0x86).integer(0);
  p.global("torch.storage", "TypedStorage").global("torch", "float32");
  device(p);
  p.bin(std::string(1, '\x01') + "c" + std::string(64, 'h')).integer(storage_bytes).integer(512);
  p.op(0x89).bin("/torch_1_2").integer(3).bin(std::string(64, 'e')).op(0x88).tuple().reduce();
  p.stop();
  return p.bytes();
}

TEST(TorchReductions, RealTorch211CudaReductionDecodes) {
  const auto root = read_pickle(fixture("ipc_handle_torch211_cuda"));
  ASSERT_EQ(root->items.size(), 2u);
  const auto h = decode_cuda_ipc_tensor(*root->items[1], "fixture");
  EXPECT_EQ(h.dtype, FERRY_DTYPE_U8);
  EXPECT_EQ(h.size.size(), 1u);
  EXPECT_EQ(h.handle_format, CudaHandleFormat::cuda_malloc);
  EXPECT_TRUE(h.device_uuid.empty());
  EXPECT_FALSE(h.ref_counter_handle.empty());
}

TEST(TorchReductions, SglangPatchedRebuildNamesTheDeviceByUuid) {
  const auto bytes = cuda_call(
      "sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified",
      [](PickleBytes& p) { p.str("GPU-0a1b2c3d-0000-1111-2222-333344445555"); }, 64);
  const auto t = decode_tensor(*read_pickle(bytes), "w");
  const auto& h = std::get<CudaIpcTensor>(t.storage);
  EXPECT_EQ(h.device, -1);
  EXPECT_EQ(h.device_uuid, "GPU-0a1b2c3d-0000-1111-2222-333344445555");
  EXPECT_EQ(t.dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(t.shape, (std::vector<std::uint64_t>{4, 4}));
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.bytes(), 64u);
  EXPECT_EQ(h.ref_counter_offset, 3u);
}

TEST(TorchReductions, ATensorLargerThanItsStorageIsRefused) {
  const auto bytes = cuda_call(
      "torch.multiprocessing.reductions", "rebuild_cuda_tensor",
      [](PickleBytes& p) { p.integer(0); }, 63);
  try {
    decode_tensor(*read_pickle(bytes), "w");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
    EXPECT_NE(std::string(e.what()).find("does not fit its storage of 63 bytes"), std::string::npos)
        << e.what();
  }
}

TEST(TorchReductions, ReleaseDecrementsExactlyItsSlot) {
  const std::string name = "/ferry_test_refcount_" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  std::int64_t slots[3] = {5, 7, 9};
  ASSERT_EQ(write(fd, slots, sizeof(slots)), static_cast<ssize_t>(sizeof(slots)));
  release_cuda_ipc_reference(name, 1);
  std::int64_t after[3] = {};
  ASSERT_EQ(pread(fd, after, sizeof(after), 0), static_cast<ssize_t>(sizeof(after)));
  EXPECT_EQ(after[0], 5);
  EXPECT_EQ(after[1], 6);
  EXPECT_EQ(after[2], 9);
  release_cuda_ipc_reference(name, 3);  // past the file's end: nothing
  ASSERT_EQ(pread(fd, after, sizeof(after), 0), static_cast<ssize_t>(sizeof(after)));
  EXPECT_EQ(after[1], 6);
  close(fd);
  shm_unlink(name.c_str());
  release_cuda_ipc_reference(name, 0);  // gone: no error, no crash
}

}  // namespace
}  // namespace ferry::torch_reductions
