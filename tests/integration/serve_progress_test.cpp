// `ferry serve` as an operator watches it: a long initial load logs its progress at info every
// progress_interval_ms (none with progress = "never"), and /metrics answers histograms of the
// seconds and bytes of every committed update whose counts add up with the counters.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <regex>
#include <sstream>

#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

// A safetensors file of `count` F32 tensors of `bytes` each, all zeros, written sparse (its data
// is a hole: what the receiver reads costs no disk).
void write_sparse_checkpoint(const std::string& path, int count, std::uint64_t bytes) {
  std::string header = "{";
  for (int i = 0; i < count; ++i) {
    header += fmt::format(R"({}"t{}":{{"dtype":"F32","shape":[{}],"data_offsets":[{},{}]}})",
                          i ? "," : "", i, bytes / 4, i * bytes, (i + 1) * bytes);
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  const std::uint64_t n = header.size();
  ASSERT_EQ(::write(fd, &n, 8), 8);
  ASSERT_EQ(::write(fd, header.data(), n), static_cast<ssize_t>(n));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(8 + n + count * bytes)), 0);
  ::close(fd);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(ServeProgress, LongInitialLoadLogsProgressLines) {
  TempDir dir;
  const std::string model = dir.file("model.safetensors");
  write_sparse_checkpoint(model, 16, 32ull << 20);  // 512 MiB
  for (const char* mode : {"auto", "never"}) {
    ServeOptions o;
    o.model_path = model;
    o.model_family = "identity";
    o.log_level = "info";
    o.sets = {"progress_interval_ms=100", std::string("progress=") + mode,
              "update.bucket_bytes=16777216"};
    ServeProcess serve(o);
    int progress = 0;
    int last_percent = -1;
    // "[time] [receiver] [info] update 1 from disk: 128.0 / 512.0 MiB (25%), 173.3 MB/s, 2 s left"
    const std::regex line(
        R"(.*\[receiver\] \[info\] update 1 from disk: [0-9.]+ / 512\.0 MiB \((\d+)%\), [0-9.]+ MB/s.*)");
    for (const auto& l : lines_of(serve.log())) {
      std::smatch m;
      if (!std::regex_match(l, m, line)) continue;
      const int percent = std::stoi(m[1]);
      EXPECT_GE(percent, last_percent);
      last_percent = percent;
      ++progress;
    }
    if (std::string(mode) == "never") {
      EXPECT_EQ(progress, 0) << serve.log();
    } else {
      // 512 MiB read, applied and fingerprinted takes well over 100 ms on any CPU.
      EXPECT_GE(progress, 1) << serve.log();
    }
    EXPECT_NE(serve.log().find("update 1 ('1') from disk: 16 tensors, 512.0 MiB"),
              std::string::npos)
        << serve.log();
    EXPECT_EQ(serve.get("/health").status, 200);
  }
}

// Every sample of the /metrics text, by its name and labels as written ("ferry_update_bytes_
// bucket{le=\"+Inf\"}"); each line must be a comment or "NAME[{LABELS}] VALUE".
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  const std::regex sample(R"(([a-z_]+(\{[^}]*\})?) (-?[0-9.e+-]+|\+Inf|NaN))");
  for (const auto& l : lines_of(text)) {
    if (l.empty() || l[0] == '#') continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(l, m, sample)) << "not a sample line: " << l;
    if (m.size() > 3) out[m[1]] = std::stod(m[3]);
  }
  return out;
}

TEST(ServeMetrics, UpdateHistogramsCountEveryCommittedUpdate) {
  TempDir dir;
  const auto v1 = make_dense_checkpoint({}, [](const std::string&) { return FERRY_DTYPE_F32; }, 1);
  const auto v2 = make_dense_checkpoint({}, [](const std::string&) { return FERRY_DTYPE_F32; }, 2);
  write_checkpoint(dir.path() / "v1", v1);
  write_checkpoint(dir.path() / "v2", v2);
  ServeOptions o;
  o.model_path = (dir.path() / "v1").string();
  ServeProcess serve(o);
  ASSERT_EQ(serve.update_from_disk((dir.path() / "v2").string()).status, 200);
  ASSERT_EQ(serve.update_from_disk((dir.path() / "v1").string()).status, 200);
  // A refused update (no such checkpoint) is not counted.
  EXPECT_NE(serve.update_from_disk(dir.file("missing")).status, 200);

  const auto reply = serve.get("/metrics");
  ASSERT_EQ(reply.status, 200);
  EXPECT_NE(reply.text.find("# TYPE ferry_update_seconds histogram\n"), std::string::npos);
  EXPECT_NE(reply.text.find("# TYPE ferry_update_bytes histogram\n"), std::string::npos);
  const auto s = samples(reply.text);
  EXPECT_EQ(s.at("ferry_updates_committed_total"), 3);
  for (const std::string name : {"ferry_update_seconds", "ferry_update_bytes"}) {
    // Cumulative buckets in increasing `le`, the last +Inf, equal to _count.
    double previous_le = -1;
    double previous_count = 0;
    int buckets = 0;
    // In the order the text lists them.
    for (const auto& l : lines_of(reply.text)) {
      if (l.rfind(name + "_bucket{le=\"", 0) != 0) continue;
      const auto close = l.find("\"}");
      const std::string le = l.substr(name.size() + 12, close - name.size() - 12);
      const double count = std::stod(l.substr(close + 3));
      EXPECT_GE(count, previous_count) << l;
      previous_count = count;
      if (le != "+Inf") {
        ++buckets;
        EXPECT_GT(std::stod(le), previous_le) << l;
        previous_le = std::stod(le);
      }
    }
    EXPECT_GE(buckets, 8) << name;
    EXPECT_EQ(s.at(name + "_bucket{le=\"+Inf\"}"), 3) << name;
    EXPECT_EQ(s.at(name + "_count"), 3) << name;
    EXPECT_GT(s.at(name + "_sum"), 0) << name;
  }
  // Every byte applied belongs to a committed update here; each (~6 KiB) is under 1 MiB.
  EXPECT_EQ(s.at("ferry_update_bytes_sum"), s.at("ferry_bytes_applied_total"));
  EXPECT_EQ(s.at("ferry_update_bytes_bucket{le=\"1048576\"}"), 3);
  EXPECT_GE(s.at("ferry_update_bytes_sum"), 3.0 * static_cast<double>(v1.total_bytes()));
  EXPECT_LE(s.at("ferry_update_seconds_sum"), 60);
}

}  // namespace
}  // namespace ferry::test
