// Fingerprints of many device ranges of one GPU at once (the session's sender and receiver).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::session {

// xxh64-interleaved-v1 (docs/fingerprint.md) of each range [data[i], +bytes[i]) on CUDA device
// `device`, in order. One fingerprint kernel covers one tensor with one block per 1 MiB chunk and
// takes about the time of one chunk (~1 ms) however few chunks it has, so the kernels run side by
// side (kernels::fingerprint_many_cuda_async); one wait at the end. The ranges are read after
// the work enqueued so far on the device's default stream (where their producer ran); work on
// other streams must be finished by the caller.
// `what` names the caller in errors. Throws FERRY_STATUS_IO on a CUDA error, UNIMPLEMENTED in a
// build without CUDA (when any range is given).
std::vector<std::uint64_t> fingerprint_device_ranges(int device,
                                                     std::span<const void* const> data,
                                                     std::span<const std::uint64_t> bytes,
                                                     const std::string& what);

}  // namespace ferry::session
