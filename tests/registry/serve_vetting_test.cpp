// tests/registry/serve_vetting_test.cpp: a real `ferry serve` whose plugin folder holds plugins
// that abort in a constructor, crash in their negotiation or never return from it (none of them
// the configured one) starts, answers /health, and its log names each file with what happened.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "plugin_files.hpp"
#include "serve_fixture.hpp"

namespace {

using ::testing::HasSubstr;

TEST(ServeVetting, ServeStartsBesideCrashingPluginsAndNamesThem) {
  ferry::testing::TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto ctorabort =
      ferry::testing::copy_plugin(ferry::testing::broken("ctorabort"), dir);
  const auto negsegv = ferry::testing::copy_plugin(ferry::testing::broken("negsegv"), dir);
  const auto negspin =
      ferry::testing::copy_plugin(ferry::testing::broken("negspin", "model"), dir);

  ferry::test::ServeOptions options;
  options.serve_args = {"--plugin-dir", dir.string()};
  options.log_level = "info";
  ferry::test::ServeProcess serve(options);
  const auto health = serve.get("/health");
  EXPECT_NE(health.status, 0) << serve.log();
  const std::string log = serve.log();
  EXPECT_THAT(log, HasSubstr("refused plugin " + ctorabort.string() +
                             ": crashed with SIGABRT (Aborted) while being loaded"));
  EXPECT_THAT(log, HasSubstr("refused plugin " + negsegv.string() +
                             ": crashed with SIGSEGV (Segmentation fault) in "
                             "ferry_plugin_negotiate"));
  EXPECT_THAT(log, HasSubstr("refused plugin " + negspin.string() +
                             ": did not return within 4 s in ferry_plugin_negotiate"));
}

}  // namespace
