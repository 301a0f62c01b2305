// tests/registry/vetting_test.cpp: plugins that abort in a constructor, crash in their negotiation
// or never return from it are refused and named, each with what happened (the signal, or the
// deadline), while the process and the good plugins beside them go on; verdicts are cached per
// file until it changes. Before vetting in a child process, each of these killed or hung the
// scanning process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ferry/sdk/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "plugin_files.hpp"
#include "registry/registry.hpp"
#include "registry/vetting.hpp"

namespace ferry::registry {
namespace {

using ferry::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string reason_for(const Registry& reg, const std::string& filename) {
  for (const auto& r : reg.refused()) {
    if (r.path.filename() == filename) return r.reason;
  }
  return "(not refused)";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class Vetting : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.folder("plugins");
    for (const auto& [kase, kind] : {std::pair{"ctorabort", "transport"},
                                     std::pair{"negsegv", "transport"},
                                     std::pair{"negspin", "model"}}) {
      ferry::testing::copy_plugin(ferry::testing::broken(kase, kind), dir_);
    }
    ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir_);
    ferry::testing::copy_plugin(ferry::testing::mock_model(), dir_);
  }
  TempDir tmp_;
  std::filesystem::path dir_;
};

TEST_F(Vetting, TheHelperIsFound) {
  ASSERT_TRUE(vet_helper().has_value()) << "ferry-plugin-vet not found next to the build";
  EXPECT_EQ(vet_helper()->filename(), "ferry-plugin-vet");
}

TEST_F(Vetting, CrashingAndHangingPluginsAreRefusedNamedAndTheGoodOnesLoad) {
  const auto start = std::chrono::steady_clock::now();
  const Registry reg({dir_});
  const double took = seconds_since(start);
  EXPECT_EQ(reason_for(reg, "libferry_transport_ctorabort.so"),
            "crashed with SIGABRT (Aborted) while being loaded (its constructors run then) "
            "(vetted in a child process); its last output: 'ctorabort: no device found, giving "
            "up (test plugin)'");
  EXPECT_EQ(reason_for(reg, "libferry_transport_negsegv.so"),
            "crashed with SIGSEGV (Segmentation fault) in ferry_plugin_negotiate (vetted in a "
            "child process)");
  const auto timeout = std::chrono::duration<double>(vet_timeout()).count();
  EXPECT_EQ(reason_for(reg, "libferry_model_negspin.so"),
            fmt::format("did not return within {} s in ferry_plugin_negotiate (vetted in a child "
                        "process, killed)",
                        timeout));
  ASSERT_EQ(reg.plugins().size(), 2u);
  EXPECT_NO_THROW(reg.transport("mock"));
  EXPECT_NO_THROW(reg.model("mock"));
  // The children ran side by side: one deadline, not one per file.
  EXPECT_LT(took, timeout + 2.5);
  // A config naming a refused plugin is told why.
  try {
    reg.model("negspin");
    ADD_FAILURE() << "negspin was found";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("refused " + (dir_ / "libferry_model_negspin.so").string() +
                                    ": did not return within"));
  }
}

TEST_F(Vetting, AVerdictIsCachedUntilTheFileChanges) {
  const auto negspin = dir_ / "libferry_model_negspin.so";
  { const Registry first({dir_}); }
  auto start = std::chrono::steady_clock::now();
  {
    const Registry again({dir_});
    EXPECT_THAT(reason_for(again, negspin.filename()), StartsWith("did not return within"));
  }
  EXPECT_LT(seconds_since(start), 1.0) << "the hanging plugin was vetted again";
  // A new mtime is a new file: vetted again (and refused again, after the deadline).
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  ::usleep(20000);
  ASSERT_EQ(::utimensat(AT_FDCWD, negspin.c_str(), times, 0), 0);
  start = std::chrono::steady_clock::now();
  {
    const Registry changed({dir_});
    EXPECT_THAT(reason_for(changed, negspin.filename()), StartsWith("did not return within"));
  }
  EXPECT_GE(seconds_since(start), std::chrono::duration<double>(vet_timeout()).count() - 0.1);
}

TEST_F(Vetting, LoadFileRefusesACrashingPluginWithItsPath) {
  const auto path = dir_ / "libferry_transport_negsegv.so";
  try {
    Registry::load_file(path);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_THAT(e.what(), HasSubstr(path.string() + ": crashed with SIGSEGV"));
  }
}

// The reasons the child's own checks give are the registry's usual ones.
TEST_F(Vetting, ARefusalFoundInTheChildIsTheUsualReason) {
  ferry::testing::copy_plugin(ferry::testing::broken("wrongmajor"), dir_);
  const Registry reg({dir_});
  EXPECT_THAT(reason_for(reg, "libferry_transport_wrongmajor.so"),
              HasSubstr("implements plugin ABI 2."));
}

}  // namespace
}  // namespace ferry::registry
