// tests/update/histogram_test.cpp: the fixed-bucket histogram behind /metrics' update histograms:
// "le" bounds are inclusive, counts cumulative, +Inf holds everything, and the text exposition
// is Prometheus's.
#include "update/histogram.hpp"

#include <gtest/gtest.h>

namespace ferry::update {
namespace {

TEST(Histogram, BoundsAreInclusiveAndCountsCumulative) {
  Histogram h({1, 10, 100});
  for (double v : {0.5, 1.0, 1.5, 10.0, 99.0, 1000.0}) h.observe(v);
  EXPECT_EQ(h.at_or_below(0), 2u);  // 0.5, 1
  EXPECT_EQ(h.at_or_below(1), 4u);  // + 1.5, 10
  EXPECT_EQ(h.at_or_below(2), 5u);  // + 99
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 1112.0);
}

TEST(Histogram, PrometheusTextListsEveryBoundThenInfSumAndCount) {
  Histogram h({0.25, 2.5});
  h.observe(0.1);
  h.observe(3);
  EXPECT_EQ(h.prometheus_text("ferry_x_seconds", "what it is"),
            "# HELP ferry_x_seconds what it is\n"
            "# TYPE ferry_x_seconds histogram\n"
            "ferry_x_seconds_bucket{le=\"0.25\"} 1\n"
            "ferry_x_seconds_bucket{le=\"2.5\"} 1\n"
            "ferry_x_seconds_bucket{le=\"+Inf\"} 2\n"
            "ferry_x_seconds_sum 3.1\n"
            "ferry_x_seconds_count 2\n");
}

TEST(Histogram, UpdateBucketsIncreaseAndSpanTheUsualSizes) {
  for (const auto& h : {update_seconds_histogram(), update_bytes_histogram()}) {
    ASSERT_GE(h.bounds().size(), 8u);
    for (std::size_t i = 1; i < h.bounds().size(); ++i) EXPECT_LT(h.bounds()[i - 1], h.bounds()[i]);
  }
  EXPECT_EQ(update_seconds_histogram().bounds().front(), 0.01);
  EXPECT_EQ(update_seconds_histogram().bounds().back(), 600);
  EXPECT_EQ(update_bytes_histogram().bounds().front(), 1048576.0);
  EXPECT_EQ(update_bytes_histogram().bounds().back(), 1099511627776.0);  // 1 TiB
  // Bytes bounds print as whole numbers.
  Histogram b = update_bytes_histogram();
  EXPECT_NE(b.prometheus_text("b", "h").find("b_bucket{le=\"1073741824\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace ferry::update
