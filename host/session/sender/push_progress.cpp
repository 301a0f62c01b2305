// A Sender's pushes shown on standard error (see session/sender/push_progress.hpp).
#include "session/sender/push_progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

namespace ferry::session {

std::function<void(const PushProgress&)> progress_display(ProgressMode mode,
                                                          std::chrono::milliseconds interval) {
  const ProgressStyle style = progress_style(mode, stderr_is_terminal());
  if (style == ProgressStyle::none) return {};
  ProgressMeter::Options options;
  options.style = style;
  options.interval = interval;
  // In place, a short interval asked for also brings the first draw closer.
  options.first_draw = std::min(options.first_draw, interval);
  auto meter = std::make_shared<ProgressMeter>(options, stderr_writer());
  return [meter](const PushProgress& p) {
    switch (p.event) {
      case PushProgress::Event::begin:
        meter->begin(p.receivers > 1 ? fmt::format("push of version {} to {} receivers",
                                                   p.version, p.receivers)
                                     : fmt::format("push of version {}", p.version),
                     p.bytes_total, p.receivers);
        break;
      case PushProgress::Event::bucket:
        meter->update(p.receiver, p.bytes_done);
        break;
      case PushProgress::Event::end:
        meter->end(p.all_committed);
        break;
    }
  };
}

}  // namespace ferry::session
