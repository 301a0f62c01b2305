// conformance/p2p.hpp: the data-path requirements of a point-to-point transport (FERRY-ABI-12 to
// 14). A loopback pair of instances in one process is driven the way the host drives a session
// (docs/plugin-abi.md, "Point-to-point call order"): connect, put + flush, send into a posted
// receive, deadlines, abort, and the same from several threads at once. Every registered range
// has a PROT_NONE guard page before and after it, so a write or read outside it faults. Each
// requirement runs in a forked child with a watchdog per step, so a crash or a hang is reported
// with the step it happened in, not suffered.
#pragma once

#include <ferry/plugin.h>

#include <string>
#include <vector>

#include "conformance/conformance.hpp"

namespace ferry::conformance {

// The outcome of each data-path requirement, in id order. `api` is the plugin's table as the
// host copied it; `caps` what get_caps answered. Forks: call it with no other threads running.
std::vector<Result> run_point_to_point(const ferry_transport_api_t& api,
                                       const ferry_transport_caps_t& caps);

// The ids, for a plugin they do not apply to.
inline constexpr const char* kPointToPointIds[] = {"FERRY-ABI-12", "FERRY-ABI-13",
                                                   "FERRY-ABI-14"};

}  // namespace ferry::conformance
