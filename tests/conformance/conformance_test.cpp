// tests/conformance/conformance_test.cpp: the conformance suite passes the mocks and fails each
// broken plugin on exactly the requirement it breaks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ferry/sdk/error.hpp>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "../registry/plugin_files.hpp"
#include "conformance/conformance.hpp"
#include "conformance/elf_symbols.hpp"
#include "conformance/p2p.hpp"

namespace ferry::conformance {
namespace {

using ::testing::HasSubstr;

std::string describe(const Report& report) {
  std::string text;
  for (const auto& r : report.results) {
    text += std::string(outcome_name(r.outcome)) + " " + r.id + " " + r.detail + "\n";
  }
  return text;
}

TEST(Conformance, MockTransportConforms) {
  const Report report = run(ferry::testing::mock_transport());
  EXPECT_TRUE(report.passed()) << describe(report);
  ASSERT_EQ(report.results.size(), requirements().size());
  for (const auto& r : report.results)
    EXPECT_EQ(r.outcome, Outcome::kPass) << r.id << ": " << r.detail;
}

// A point-to-point transport with direct writes: put + flush, send/recv, deadlines and threads.
TEST(Conformance, LoopTransportConformsOnTheDataPath) {
  const Report report = run(ferry::testing::mock_dir() / "libferry_transport_loop.so");
  EXPECT_TRUE(report.passed()) << describe(report);
  EXPECT_THAT(report.result("FERRY-ABI-12").detail,
              HasSubstr("put + flush (whole range and at an offset); send_bucket into a posted "
                        "recv_bucket"));
  EXPECT_THAT(report.result("FERRY-ABI-13").detail, HasSubstr("an unanswered receive times out"));
}

// The in-tree UCX transport over loopback, when this build has it.
TEST(Conformance, UcxTransportConforms) {
  const char* ucx = std::getenv("FERRY_TEST_UCX_PLUGIN");
  if (ucx == nullptr || *ucx == '\0') GTEST_SKIP() << "this build has no UCX plugin";
  const Report report = run(ucx);
  EXPECT_TRUE(report.passed()) << describe(report);
  for (const char* id : kPointToPointIds) {
    EXPECT_EQ(report.result(id).outcome, Outcome::kPass) << id << ": " << report.result(id).detail;
  }
  EXPECT_THAT(report.result("FERRY-ABI-13").detail, HasSubstr("abort ends a waiting receive"));
}

// Every transport and model plugin built in this tree conforms (a device transport's data path
// shows N/A here; its GPU tests cover it).
TEST(Conformance, EveryInTreePluginConforms) {
  const char* dirs = std::getenv("FERRY_TEST_IN_TREE_PLUGIN_DIRS");
  ASSERT_NE(dirs, nullptr) << "FERRY_TEST_IN_TREE_PLUGIN_DIRS is not set";
  int checked = 0;
  std::string list = dirs;
  for (std::size_t start = 0; start < list.size();) {
    const auto end = std::min(list.find(':', start), list.size());
    const std::filesystem::path dir = list.substr(start, end - start);
    start = end + 1;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = entry.path().filename().string();
      // Plugin files only, as the registry names them (a plugin's helper library beside it,
      // such as torch_gloo's libtorch backend, is not a plugin).
      const bool plugin =
          name.rfind("libferry_transport_", 0) == 0 || name.rfind("libferry_model_", 0) == 0;
      if (!plugin || entry.path().extension() != ".so") continue;
      const Report report = run(entry.path());
      EXPECT_TRUE(report.passed()) << describe(report);
      ++checked;
    }
  }
  EXPECT_GE(checked, 2);
}

TEST(Conformance, MockModelConforms) {
  const Report report = run(ferry::testing::mock_model());
  EXPECT_TRUE(report.passed()) << describe(report);
  EXPECT_EQ(report.result("FERRY-ABI-7").outcome, Outcome::kNotApplicable);
  EXPECT_EQ(report.result("FERRY-ABI-6").outcome, Outcome::kPass);
  EXPECT_EQ(report.result("FERRY-ABI-12").outcome, Outcome::kNotApplicable);
}

struct BrokenCase {
  const char* name;
  const char* kind;
  std::vector<const char*> failing;  // requirements that must FAIL
  bool only;                         // and every other one must PASS
  const char* detail;                // substring of the first failing requirement's detail
};

void PrintTo(const BrokenCase& c, std::ostream* os) {
  *os << c.name;
}

class ConformanceBroken : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(ConformanceBroken, FailsTheRequirementItBreaks) {
  const BrokenCase& c = GetParam();
  const Report report = run(ferry::testing::broken(c.name, c.kind));
  EXPECT_FALSE(report.passed());
  for (const char* id : c.failing) {
    EXPECT_EQ(report.result(id).outcome, Outcome::kFail) << id << "\n" << describe(report);
  }
  EXPECT_THAT(report.result(c.failing.front()).detail, HasSubstr(c.detail));
  if (!c.only) return;
  for (const auto& r : report.results) {
    bool expected_failure = false;
    for (const char* id : c.failing) expected_failure = expected_failure || r.id == id;
    if (!expected_failure) {
      EXPECT_EQ(r.outcome, Outcome::kPass) << r.id << ": " << r.detail;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EachBrokenPlugin, ConformanceBroken,
    ::testing::Values(
        BrokenCase{"noentry",
                   "transport",
                   {"FERRY-ABI-1", "FERRY-ABI-9"},
                   false,
                   "does not export the entry symbol"},
        BrokenCase{"wrongmajor", "transport", {"FERRY-ABI-2"}, false, "implements plugin ABI 2."},
        BrokenCase{"silent", "transport", {"FERRY-ABI-2"}, false, "did not fill in"},
        BrokenCase{"refuses", "transport", {"FERRY-ABI-2"}, false, "refused a host of ABI 1." },
        BrokenCase{"anymajor", "transport", {"FERRY-ABI-3"}, true, "accepted a host of ABI 2.0"},
        BrokenCase{"alpha", "transport", {"FERRY-ABI-4"}, true, "reports name 'beta'"},
        BrokenCase{"kindswap", "model", {"FERRY-ABI-4"}, true, "reports kind transport"},
        BrokenCase{
            "garbage", "transport", {"FERRY-ABI-4", "FERRY-ABI-5"}, false, "not a readable string"},
        BrokenCase{"shorttable", "transport", {"FERRY-ABI-5"}, false, "(short struct)"},
        BrokenCase{"nullfn", "transport", {"FERRY-ABI-5"}, false, "'destroy' is NULL"},
        BrokenCase{"lenient", "transport", {"FERRY-ABI-6"}, true, "returned success"},
        BrokenCase{"badcaps", "transport", {"FERRY-ABI-7"}, true, "DIRECT_WRITE needs put"},
        BrokenCase{"halfset",
                   "transport",
                   {"FERRY-ABI-8"},
                   false,  // and its data path cannot be checked (FERRY-ABI-12 to 14: SKIP)
                   "register_memory without deregister_memory"},
        BrokenCase{"leaky", "transport", {"FERRY-ABI-9"}, true, "ferry_leaky_debug_counter"},
        BrokenCase{"overwrite", "transport", {"FERRY-ABI-10"}, true, "wrote past struct_size"},
        BrokenCase{"noinstance",
                   "transport",
                   {"FERRY-ABI-11", "FERRY-ABI-12", "FERRY-ABI-13", "FERRY-ABI-14"},
                   true,
                   "success but no instance"},
        // The vendor's three data-path bugs that passed every ABI-level check:
        BrokenCase{"putoverrun",
                   "transport",
                   {"FERRY-ABI-12"},
                   true,
                   "crashed with SIGSEGV (Segmentation fault) during: put of 65536 bytes into "
                   "the receiver's whole registered range"},
        BrokenCase{"stuckflush",
                   "transport",
                   {"FERRY-ABI-12", "FERRY-ABI-13"},
                   true,
                   "did not return within 8.0 s: flush after a put of 65536 bytes"},
        BrokenCase{"racycreate",
                   "transport",
                   {"FERRY-ABI-14"},
                   true,
                   "during: create and destroy instances on 8 threads at once"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) { return std::string(info.param.name); });

TEST(Conformance, TextFileFailsLoadingAndSymbolTable) {
  ferry::testing::TempDir tmp;
  const auto text = ferry::testing::write_text_plugin(tmp.path(), "libferry_transport_text.so");
  const Report report = run(text);
  EXPECT_EQ(report.result("FERRY-ABI-1").outcome, Outcome::kFail);
  EXPECT_THAT(report.result("FERRY-ABI-1").detail, HasSubstr("not a loadable shared object"));
  EXPECT_EQ(report.result("FERRY-ABI-9").outcome, Outcome::kFail);
  EXPECT_THAT(report.result("FERRY-ABI-9").detail, HasSubstr("not an ELF file"));
  EXPECT_EQ(report.result("FERRY-ABI-2").outcome, Outcome::kSkipped);
  EXPECT_EQ(report.result("FERRY-ABI-2").detail, "not checked: needs FERRY-ABI-1");
}

TEST(Conformance, EveryRequirementHasAUniqueNumberedId) {
  std::set<std::string> ids;
  for (std::size_t i = 0; i < requirements().size(); ++i) {
    EXPECT_EQ(requirements()[i].id, "FERRY-ABI-" + std::to_string(i + 1));
    EXPECT_TRUE(ids.insert(requirements()[i].id).second);
  }
  EXPECT_THROW(run(ferry::testing::mock_model()).result("FERRY-ABI-99"), Error);
}

TEST(ElfSymbols, MockExportsOnlyTheEntryAsAFunction) {
  const auto symbols = read_dynamic_symbols(ferry::testing::mock_transport());
  std::vector<std::string> exported;
  for (const auto& s : symbols) {
    if (s.exported()) exported.push_back(s.name);
  }
  EXPECT_EQ(exported, std::vector<std::string>{"ferry_plugin_negotiate"});
  bool imports_something = false;
  for (const auto& s : symbols) imports_something = imports_something || !s.exported();
  EXPECT_TRUE(imports_something);  // libc / libstdc++ imports are listed, not exported
}

TEST(ElfSymbols, TruncatedFileIsCorruptData) {
  ferry::testing::TempDir tmp;
  const auto truncated = tmp.path() / "libferry_transport_cut.so";
  {
    std::ifstream in(ferry::testing::mock_transport(), std::ios::binary);
    std::string head(200, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(truncated, std::ios::binary) << head;
  }
  try {
    read_dynamic_symbols(truncated);
    FAIL() << "read a truncated ELF file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA);
    EXPECT_THAT(e.what(), HasSubstr("lies past the end (200 bytes)"));
  }
}

}  // namespace
}  // namespace ferry::conformance
