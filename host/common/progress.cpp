// Progress of long work on a terminal or in a log (see common/progress.hpp).
#include "common/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace ferry {
namespace {

// The unit every size of a line is written in, chosen by the total (so that "done / total"
// share one).
struct Unit {
  double bytes;
  const char* name;
};
Unit unit_for(std::uint64_t total) {
  if (total >= (1ull << 30)) return {1073741824.0, "GiB"};
  if (total >= (1ull << 20)) return {1048576.0, "MiB"};
  return {1024.0, "KiB"};
}

std::string duration_text(double seconds) {
  const auto s = static_cast<std::uint64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{} min {} s", s / 60, s % 60);
  return fmt::format("{} h {} min", s / 3600, s % 3600 / 60);
}

}  // namespace

std::optional<ProgressMode> parse_progress_mode(std::string_view name) {
  for (const auto& [text, mode] : kProgressModes) {
    if (text == name) return mode;
  }
  return std::nullopt;
}

const char* progress_mode_name(ProgressMode mode) noexcept {
  for (const auto& [text, m] : kProgressModes) {
    if (m == mode) return text.data();
  }
  return "auto";
}

ProgressStyle progress_style(ProgressMode mode, bool terminal) noexcept {
  switch (mode) {
    case ProgressMode::automatic:
      return terminal ? ProgressStyle::in_place : ProgressStyle::lines;
    case ProgressMode::terminal:
      return terminal ? ProgressStyle::in_place : ProgressStyle::none;
    case ProgressMode::lines:
      return ProgressStyle::lines;
    case ProgressMode::never:
      break;
  }
  return ProgressStyle::none;
}

bool stderr_is_terminal() {
  if (::isatty(STDERR_FILENO) != 1) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

ProgressMeter::ProgressMeter(Options options, Writer writer)
    : options_(std::move(options)), writer_(std::move(writer)) {}

ProgressMeter::Clock::time_point ProgressMeter::now() const {
  return options_.now ? options_.now() : Clock::now();
}

void ProgressMeter::begin(std::string what, std::uint64_t total, std::size_t parts) {
  const auto at = now();
  std::lock_guard lock(mutex_);
  running_ = options_.style != ProgressStyle::none;
  what_ = std::move(what);
  total_ = total;
  done_.assign(std::max<std::size_t>(parts, 1), 0);
  start_ = at;
  last_shown_.reset();
}

void ProgressMeter::update(std::size_t part, std::uint64_t done) {
  if (options_.style == ProgressStyle::none) return;
  const auto at = now();
  std::lock_guard lock(mutex_);
  if (!running_ || part >= done_.size()) return;
  done_[part] = std::min(done, total_);
  bool due = false;
  if (options_.style == ProgressStyle::in_place) {
    due = last_shown_ ? at - *last_shown_ >= options_.redraw : at - start_ >= options_.first_draw;
  } else {
    due = at - last_shown_.value_or(start_) >= options_.interval;
  }
  if (due) emit_locked(at, false, true);
}

void ProgressMeter::end(bool ok) {
  const auto at = now();
  std::lock_guard lock(mutex_);
  if (!running_) return;
  running_ = false;
  if (last_shown_) emit_locked(at, true, ok);
}

void ProgressMeter::emit_locked(Clock::time_point at, bool final, bool ok) {
  const std::uint64_t parts = done_.size();
  const std::uint64_t done = std::accumulate(done_.begin(), done_.end(), std::uint64_t{0});
  const std::uint64_t total = total_ * parts;
  const std::chrono::duration<double> elapsed = at - start_;
  std::string line = what_ + ": ";
  if (final && ok) {
    const Unit u = unit_for(total);
    line += fmt::format("{:.1f} {} in {:.1f} s", total / u.bytes, u.name, elapsed.count());
    if (elapsed.count() > 0) line += fmt::format(" ({:.1f} MB/s)", total / elapsed.count() / 1e6);
  } else {
    if (final) line += "stopped at ";
    line += figures(done, total, elapsed);
  }
  last_shown_ = at;
  writer_(line, options_.style, final);
}

std::string ProgressMeter::figures(std::uint64_t done, std::uint64_t total,
                                   std::chrono::duration<double> elapsed) {
  const Unit u = unit_for(total);
  const double percent = total > 0 ? 100.0 * static_cast<double>(done) / total : 100.0;
  std::string text = fmt::format("{:.1f} / {:.1f} {} ({:.0f}%)", done / u.bytes, total / u.bytes,
                                 u.name, std::floor(percent));
  const double seconds = elapsed.count();
  if (done == 0 || seconds <= 0) return text;
  const double rate = static_cast<double>(done) / seconds;  // bytes per second
  text += fmt::format(", {:.1f} MB/s", rate / 1e6);
  if (done < total) text += ", " + duration_text(static_cast<double>(total - done) / rate) + " left";
  return text;
}

ProgressMeter::Writer stderr_writer() {
  return [](const std::string& line, ProgressStyle style, bool final) {
    std::string out;
    if (style == ProgressStyle::in_place) {
      out = "\r" + line + "\x1b[K";
      if (final) out += '\n';
    } else {
      out = line + '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stderr);
    std::fflush(stderr);
  };
}

}  // namespace ferry
