// The CUDA update path in a build without the cuda feature: every entry point refuses with
// UNIMPLEMENTED (the engine never reaches them: a layout with device parameters is refused at
// begin), so the engine links the same way in both builds.
#include "update/cuda_apply.hpp"

#include <ferry/sdk/error.hpp>

namespace ferry::update {
namespace {

[[noreturn]] void no_cuda() {
  fail(FERRY_STATUS_UNIMPLEMENTED, "this build has no CUDA support (-Dcuda=disabled)");
}

}  // namespace

struct CudaApplier::Cuda {};

CudaApplier::CudaApplier(int /*device*/) { no_cuda(); }
CudaApplier::~CudaApplier() = default;
int CudaApplier::device() const noexcept { return -1; }
std::shared_ptr<const void> CudaApplier::prepare(std::span<const ferry_plan_op_t>,
                                                 std::span<const kernels::EntryView>,
                                                 std::span<const std::uint64_t>,
                                                 std::span<const kernels::ParamView>) {
  no_cuda();
}
void CudaApplier::apply(const std::shared_ptr<const void>&, std::span<const std::byte>, bool,
                        const Fp8Ops&, bool) {
  no_cuda();
}
void CudaApplier::synchronize() {}
std::string CudaApplier::drain() noexcept { return {}; }
std::vector<std::uint64_t> CudaApplier::fingerprints(std::span<const std::byte* const>,
                                                     std::span<const std::uint64_t>) {
  no_cuda();
}
void CudaApplier::queue_fingerprints(std::span<const std::byte* const>,
                                     std::span<const std::uint64_t>) {
  no_cuda();
}
std::vector<std::vector<std::uint64_t>> CudaApplier::take_queued_fingerprints() {
  return {};
}
void CudaApplier::drop_queued_fingerprints() noexcept {}
std::vector<std::uint64_t> CudaApplier::chunk_hashes(std::span<const std::byte* const>,
                                                     std::span<const std::uint64_t>,
                                                     std::span<const std::uint64_t>) {
  no_cuda();
}
void CudaApplier::copy_to_host(void*, const void*, std::uint64_t) { no_cuda(); }
bool CudaApplier::is_device_memory(const void*) noexcept { return false; }
int CudaApplier::device_of(const void*) { no_cuda(); }
std::shared_ptr<std::byte> CudaApplier::pinned_host(std::uint64_t) { no_cuda(); }

}  // namespace ferry::update
