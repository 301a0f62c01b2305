// Fixed-bucket histograms and their Prometheus text (see update/histogram.hpp).
#include "update/histogram.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry::update {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), in_bucket_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  // The first bound at or above the value (Prometheus buckets are "le": less or equal).
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  in_bucket_[static_cast<std::size_t>(at)] += 1;
  sum_ += value;
  count_ += 1;
}

std::uint64_t Histogram::at_or_below(std::size_t i) const {
  std::uint64_t n = 0;
  for (std::size_t k = 0; k <= i && k < in_bucket_.size(); ++k) n += in_bucket_[k];
  return n;
}

std::string Histogram::prometheus_text(const std::string& name, const std::string& help) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += in_bucket_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     sum_, name, count_);
  return out;
}

Histogram update_seconds_histogram() {
  return Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600});
}

Histogram update_bytes_histogram() {
  std::vector<double> bounds;
  for (double b = 1 << 20; b <= 1099511627776.0; b *= 4) bounds.push_back(b);
  return Histogram(std::move(bounds));
}

}  // namespace ferry::update
