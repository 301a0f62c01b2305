// session/sender/push_progress.hpp: shows a Sender's pushes on standard error
// (common/progress.hpp): the SenderOptions::progress that `ferry push` and the C API (Python's
// Sender) install.
#pragma once

#include <chrono>
#include <functional>

#include "common/progress.hpp"
#include "session/sender/sender.hpp"

namespace ferry::session {

// A SenderOptions::progress that draws each push as `mode` says on standard error (in place on
// a terminal, a line every `interval` otherwise): "push of version 3: 1.2 / 2.3 GiB (52%),
// 180.3 MB/s, 6 s left", summed over the receivers ("push of version 3 to 2 receivers: ...").
// In place, the first draw comes after 0.5 s, or after `interval` when that is shorter.
// Empty when the mode shows nothing on this standard error.
std::function<void(const PushProgress&)> progress_display(ProgressMode mode,
                                                          std::chrono::milliseconds interval);

}  // namespace ferry::session
