// common/progress.hpp: progress of long work (a push, a checkpoint load) shown to a person: one
// line redrawn in place on a terminal, or a plain line every few seconds where the output is a
// file, a pipe or a log (and nothing for work done within that time). Bytes done of the total,
// rate and time left. The clock is injected so that tests drive it.
//
// Threading: every method of ProgressMeter may be called from any thread (one mutex; an update
// that prints nothing costs a clock read). The writer is called with that mutex held, never
// concurrently with itself.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry {

// When progress is shown (config key `progress`, `ferry push --progress`, Python's progress=).
enum class ProgressMode {
  automatic,  // "auto": in place on a terminal, else a line every interval
  terminal,   // "terminal": in place on a terminal, else nothing
  lines,      // "lines": a line every interval, terminal or not
  never,      // "never"
};

// Every mode by its name.
inline constexpr std::array<std::pair<std::string_view, ProgressMode>, 4> kProgressModes = {{
    {"auto", ProgressMode::automatic},
    {"terminal", ProgressMode::terminal},
    {"lines", ProgressMode::lines},
    {"never", ProgressMode::never},
}};

// The mode named `name` ("auto", "terminal", "lines", "never"), or nullopt.
std::optional<ProgressMode> parse_progress_mode(std::string_view name);
const char* progress_mode_name(ProgressMode mode) noexcept;

// How a mode shows on an output that is (or is not) a terminal.
enum class ProgressStyle {
  none,      // nothing at all
  in_place,  // one line redrawn in place (carriage return, erase to the end of the line)
  lines,     // a plain line every interval
};
ProgressStyle progress_style(ProgressMode mode, bool terminal) noexcept;

// Whether standard error is a terminal that can redraw a line (isatty, TERM not "dumb").
bool stderr_is_terminal();

class ProgressMeter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    ProgressStyle style = ProgressStyle::lines;
    // Lines: the first comes this long after begin(), the next ones this far apart.
    std::chrono::milliseconds interval{5000};
    // In place: the first draw this long after begin() (short work draws nothing), redraws at
    // most this often.
    std::chrono::milliseconds first_draw{500};
    std::chrono::milliseconds redraw{200};
    std::function<Clock::time_point()> now;  // empty: Clock::now
  };
  // What to show, without control characters. `final`: the line that closes the work.
  // In place, the writer is expected to return to the line's start and erase what was there
  // (stderr_writer does); lines are whole lines.
  using Writer = std::function<void(const std::string& line, ProgressStyle style, bool final)>;

  ProgressMeter(Options options, Writer writer);

  // Starts a piece of work named `what` ("push of version 3") of `parts` parts (receivers) of
  // `total` bytes each: the figures shown are the sum over parts. Resets a previous one.
  void begin(std::string what, std::uint64_t total, std::size_t parts = 1);
  // Part `part` has done `done` of its `total` bytes (values only grow; a smaller one is kept
  // as given, e.g. a receiver whose session was replaced). Prints when the style and the
  // throttle say so.
  void update(std::size_t part, std::uint64_t done);
  // Ends the work: in place, the closing line (when anything was drawn); lines, the closing
  // line when at least one line was printed. `ok` false says the work failed or stopped.
  void end(bool ok = true);

  // The text of the line for `done` of `total` bytes `elapsed` after the start: "1.2 / 2.3 GiB
  // (52%), 180.3 MB/s, 6 s left". Exposed for tests.
  static std::string figures(std::uint64_t done, std::uint64_t total,
                             std::chrono::duration<double> elapsed);

 private:
  Clock::time_point now() const;
  void emit_locked(Clock::time_point at, bool final, bool ok);

  Options options_;
  Writer writer_;
  std::mutex mutex_;
  bool running_ = false;
  std::string what_;
  std::uint64_t total_ = 0;  // per part
  std::vector<std::uint64_t> done_;
  Clock::time_point start_{};
  std::optional<Clock::time_point> last_shown_;  // nullopt: nothing shown yet
};

// A writer onto standard error: in place with "\r" and "ESC[K", lines with a newline.
ProgressMeter::Writer stderr_writer();

}  // namespace ferry
