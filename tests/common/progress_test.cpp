// tests/common/progress_test.cpp: the progress meter of host/common/progress.hpp under a driven
// clock: lines every interval and none for short work, the in-place form and its throttle, the
// figures (rate, time left), parts summed, the closing lines, the modes, the stderr writer's
// bytes.
#include "common/progress.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace ferry {
namespace {

using namespace std::chrono_literals;

struct Shown {
  std::string line;
  ProgressStyle style;
  bool final;
};

// A meter whose clock is `now` and whose output lands in `shown`.
struct Driven {
  explicit Driven(ProgressStyle style) {
    ProgressMeter::Options o;
    o.style = style;
    o.interval = 5000ms;
    o.first_draw = 500ms;
    o.redraw = 200ms;
    o.now = [this] { return now; };
    meter = std::make_unique<ProgressMeter>(
        o, [this](const std::string& line, ProgressStyle s, bool final) {
          shown.push_back({line, s, final});
        });
  }
  void advance(std::chrono::milliseconds d) { now += d; }
  ProgressMeter::Clock::time_point now{};
  std::vector<Shown> shown;
  std::unique_ptr<ProgressMeter> meter;
};

constexpr std::uint64_t kMiB = 1ull << 20;

TEST(ProgressMeter, LinesComeEveryIntervalAndNotBetween) {
  Driven d(ProgressStyle::lines);
  d.meter->begin("push of version 3", 1000 * kMiB);
  for (int i = 1; i <= 49; ++i) {  // 4.9 s: 100 ms per 10 MiB
    d.advance(100ms);
    d.meter->update(0, i * 10 * kMiB);
  }
  EXPECT_TRUE(d.shown.empty()) << d.shown.front().line;
  d.advance(100ms);
  d.meter->update(0, 500 * kMiB);  // 5.0 s
  ASSERT_EQ(d.shown.size(), 1u);
  // 500 MiB in 5 s: 104.9 MB/s; 500 MiB left at that rate: 5 s.
  EXPECT_EQ(d.shown[0].line, "push of version 3: 500.0 / 1000.0 MiB (50%), 104.9 MB/s, 5 s left");
  EXPECT_EQ(d.shown[0].style, ProgressStyle::lines);
  EXPECT_FALSE(d.shown[0].final);
  d.advance(4900ms);
  d.meter->update(0, 990 * kMiB);
  EXPECT_EQ(d.shown.size(), 1u);  // 4.9 s after the last line
  d.advance(100ms);
  d.meter->update(0, 1000 * kMiB);
  ASSERT_EQ(d.shown.size(), 2u);
  EXPECT_EQ(d.shown[1].line, "push of version 3: 1000.0 / 1000.0 MiB (100%), 104.9 MB/s");
  d.advance(500ms);
  d.meter->end();
  ASSERT_EQ(d.shown.size(), 3u);
  EXPECT_EQ(d.shown[2].line, "push of version 3: 1000.0 MiB in 10.5 s (99.9 MB/s)");
  EXPECT_TRUE(d.shown[2].final);
}

TEST(ProgressMeter, ShortWorkShowsNothing) {
  Driven d(ProgressStyle::lines);
  d.meter->begin("load", 100 * kMiB);
  d.advance(4999ms);
  d.meter->update(0, 100 * kMiB);
  d.meter->end();
  EXPECT_TRUE(d.shown.empty());

  Driven t(ProgressStyle::in_place);
  t.meter->begin("load", 100 * kMiB);
  t.advance(499ms);
  t.meter->update(0, 100 * kMiB);
  t.meter->end();
  EXPECT_TRUE(t.shown.empty());
}

TEST(ProgressMeter, InPlaceDrawsAfterTheFirstDelayAndThrottlesRedraws) {
  Driven d(ProgressStyle::in_place);
  d.meter->begin("push of version 1", 4ull << 30);
  std::uint64_t done = 0;
  for (int i = 0; i < 100; ++i) {  // 2 s in steps of 20 ms, 20 MiB each
    d.advance(20ms);
    done += 20 * kMiB;
    d.meter->update(0, done);
  }
  // Draws at 0.5 s, then every 200 ms: 0.5, 0.7, ..., 1.9 s.
  ASSERT_EQ(d.shown.size(), 8u);
  for (const auto& s : d.shown) {
    EXPECT_EQ(s.style, ProgressStyle::in_place);
    EXPECT_FALSE(s.final);
  }
  // At 0.5 s: 500 MiB of 4 GiB, 1048.6 MB/s, (4096 - 500) MiB left: 3.6 s -> 4 s.
  EXPECT_EQ(d.shown[0].line,
            "push of version 1: 0.5 / 4.0 GiB (12%), 1048.6 MB/s, 4 s left");
  d.meter->end(false);
  ASSERT_EQ(d.shown.size(), 9u);
  EXPECT_TRUE(d.shown.back().final);
  EXPECT_EQ(d.shown.back().line.rfind("push of version 1: stopped at 2.0 / 4.0 GiB (48%)", 0), 0u)
      << d.shown.back().line;
}

TEST(ProgressMeter, PartsAreSummed) {
  Driven d(ProgressStyle::lines);
  d.meter->begin("push of version 2 to 2 receivers", 100 * kMiB, 2);
  d.advance(5s);
  d.meter->update(0, 100 * kMiB);
  d.advance(5s);
  d.meter->update(1, 50 * kMiB);
  ASSERT_EQ(d.shown.size(), 2u);
  EXPECT_EQ(d.shown[0].line.rfind("push of version 2 to 2 receivers: 100.0 / 200.0 MiB (50%)", 0),
            0u) << d.shown[0].line;
  EXPECT_EQ(d.shown[1].line.rfind("push of version 2 to 2 receivers: 150.0 / 200.0 MiB (75%)", 0),
            0u) << d.shown[1].line;
  d.meter->update(7, 1);  // no such part: ignored
  EXPECT_EQ(d.shown.size(), 2u);
}

TEST(ProgressMeter, NoneShowsNothingAndEndWithoutBeginIsHarmless) {
  Driven d(ProgressStyle::none);
  d.meter->end();
  d.meter->begin("load", 10);
  d.advance(60s);
  d.meter->update(0, 5);
  d.meter->end();
  EXPECT_TRUE(d.shown.empty());
}

TEST(ProgressMeter, FiguresNameRateAndTimeLeft) {
  using std::chrono::duration;
  EXPECT_EQ(ProgressMeter::figures(0, 10 * kMiB, duration<double>(3)), "0.0 / 10.0 MiB (0%)");
  EXPECT_EQ(ProgressMeter::figures(512, 2048, duration<double>(1)),
            "0.5 / 2.0 KiB (25%), 0.0 MB/s, 3 s left");
  // 1 GiB of 100 GiB in 10 s: 99 GiB left at 107.4 MB/s is 990 s.
  EXPECT_EQ(ProgressMeter::figures(1ull << 30, 100ull << 30, duration<double>(10)),
            "1.0 / 100.0 GiB (1%), 107.4 MB/s, 16 min 30 s left");
  EXPECT_EQ(ProgressMeter::figures(1ull << 30, 1000ull << 30, duration<double>(10)),
            "1.0 / 1000.0 GiB (0%), 107.4 MB/s, 2 h 46 min left");
}

TEST(ProgressMode, NamesAndStyles) {
  EXPECT_EQ(parse_progress_mode("auto"), ProgressMode::automatic);
  EXPECT_EQ(parse_progress_mode("terminal"), ProgressMode::terminal);
  EXPECT_EQ(parse_progress_mode("lines"), ProgressMode::lines);
  EXPECT_EQ(parse_progress_mode("never"), ProgressMode::never);
  EXPECT_EQ(parse_progress_mode("always"), std::nullopt);
  for (const char* name : {"auto", "terminal", "lines", "never"}) {
    EXPECT_STREQ(progress_mode_name(*parse_progress_mode(name)), name);
  }
  EXPECT_EQ(progress_style(ProgressMode::automatic, true), ProgressStyle::in_place);
  EXPECT_EQ(progress_style(ProgressMode::automatic, false), ProgressStyle::lines);
  EXPECT_EQ(progress_style(ProgressMode::terminal, true), ProgressStyle::in_place);
  EXPECT_EQ(progress_style(ProgressMode::terminal, false), ProgressStyle::none);
  EXPECT_EQ(progress_style(ProgressMode::lines, true), ProgressStyle::lines);
  EXPECT_EQ(progress_style(ProgressMode::never, true), ProgressStyle::none);
}

// The bytes stderr_writer puts on standard error (a pipe here).
std::string written_to_stderr(const std::function<void()>& write) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  write();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(fds[0]);
  return out;
}

TEST(ProgressMeter, StderrWriterRedrawsInPlaceOrWritesLines) {
  auto w = stderr_writer();
  EXPECT_EQ(written_to_stderr([&] {
              w("a", ProgressStyle::in_place, false);
              w("b", ProgressStyle::in_place, true);
            }),
            "\ra\x1b[K\rb\x1b[K\n");
  EXPECT_EQ(written_to_stderr([&] {
              w("a", ProgressStyle::lines, false);
              w("b", ProgressStyle::lines, true);
            }),
            "a\nb\n");
}

}  // namespace
}  // namespace ferry
