// plugins/ucx/process_state.hpp: whether a same-host peer process still runs, from
// /proc/PID/stat. The UCX plugin's progress thread asks this every liveness period for each peer
// on its host (error_mode none has no keepalive of its own); a peer that exits and is reaped
// between the open and the read is an answer ("gone"), never an exception.
#pragma once

#include <cstdint>

namespace ferry::ucx {

// True when process `pid` no longer runs: no such process, reaped while being read, a zombie
// nobody reaped yet, or exiting (killed: its files may already be closed). Never throws.
bool process_gone(std::uint32_t pid) noexcept;

}  // namespace ferry::ucx
