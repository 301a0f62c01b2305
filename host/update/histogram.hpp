// update/histogram.hpp: a histogram of observed values with fixed upper bounds, as Prometheus
// defines one (a cumulative count per bound and +Inf, the sum, the count), and its text
// exposition; the update engine keeps one of the seconds and one of the bytes of each committed
// update (docs/http-api.md, /metrics).
//
// Threading: a plain value; its owner guards it (the engine reads and writes it under its state
// lock, metrics() hands out copies).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::update {

class Histogram {
 public:
  // `bounds`: the upper bounds of the buckets, increasing (+Inf is added).
  explicit Histogram(std::vector<double> bounds);

  void observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations at or below bounds()[i] (cumulative), i < bounds().size(); count() for +Inf.
  std::uint64_t at_or_below(std::size_t i) const;
  std::uint64_t count() const { return count_; }
  double sum() const { return sum_; }

  // The exposition of metric `name` of the text format: HELP, TYPE histogram, one
  // name_bucket{le="..."} line per bound and +Inf, name_sum, name_count.
  std::string prometheus_text(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> in_bucket_;  // per bound, not cumulative; the last one is +Inf
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

// The buckets of ferry_update_seconds: 10 ms to 10 min, about 2.5x apart.
Histogram update_seconds_histogram();
// The buckets of ferry_update_bytes: 1 MiB to 1 TiB, 4x apart.
Histogram update_bytes_histogram();

}  // namespace ferry::update
