// tests/registry/search_path_test.cpp: the plugin search order (config folders, then
// FERRY_PLUGIN_PATH, then the install folder, then extra folders) and its precedence on disk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "ferry_build_config.h"
#include "plugin_files.hpp"
#include "registry/registry.hpp"

namespace ferry::registry {
namespace {

using ferry::testing::TempDir;
using Paths = std::vector<std::filesystem::path>;

TEST(RegistrySearchPath, ConfigThenEnvironmentThenInstallThenExtra) {
  const Paths dirs = search_path({"/cfg/a", "/cfg/b"}, std::string("/env/a:/env/b"), false,
                                 "/install", {"/build/plugins"});
  EXPECT_EQ(dirs, (Paths{"/cfg/a", "/cfg/b", "/env/a", "/env/b", "/install", "/build/plugins"}));
}

TEST(RegistrySearchPath, EnvironmentIsIgnoredWithElevatedPrivileges) {
  const Paths dirs = search_path({"/cfg"}, std::string("/env/evil"), true, "/install", {});
  EXPECT_EQ(dirs, (Paths{"/cfg", "/install"}));
}

TEST(RegistrySearchPath, EmptyEnvironmentEntriesAreSkipped) {
  const Paths dirs = search_path({}, std::string(":/env/a::/env/b:"), false, "/install", {});
  EXPECT_EQ(dirs, (Paths{"/env/a", "/env/b", "/install"}));
}

TEST(RegistrySearchPath, DefaultSearchPathReadsFerryPluginPathAndInstallDir) {
  ::setenv("FERRY_PLUGIN_PATH", "/from/env", 1);
  const Paths dirs = Registry::default_search_path({"/cfg"}, {"/last"});
  ::unsetenv("FERRY_PLUGIN_PATH");
  EXPECT_EQ(dirs, (Paths{"/cfg", "/from/env", FERRY_PLUGIN_INSTALL_DIR, "/last"}));
}

TEST(RegistrySearchPath, ConfigFolderWinsOverFerryPluginPath) {
  TempDir tmp;
  const auto config_dir = tmp.folder("config");
  const auto env_dir = tmp.folder("env");
  const auto from_config =
      ferry::testing::copy_plugin(ferry::testing::mock_transport(), config_dir);
  const auto from_env = ferry::testing::copy_plugin(ferry::testing::mock_transport(), env_dir);
  ferry::testing::copy_plugin(ferry::testing::mock_model(), env_dir);
  ::setenv("FERRY_PLUGIN_PATH", env_dir.c_str(), 1);
  Registry reg(Registry::default_search_path({config_dir}));
  ::unsetenv("FERRY_PLUGIN_PATH");
  EXPECT_EQ(reg.transport("mock")->info().path, from_config);
  EXPECT_EQ(reg.model("mock")->info().path, env_dir / "libferry_model_mock.so");
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_EQ(reg.refused()[0].path, from_env);
  EXPECT_EQ(reg.refused()[0].reason, "shadowed by " + from_config.string());
}

TEST(RegistrySearchPath, FolderListedTwiceIsScannedOnce) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  Registry reg({dir, dir / ".", dir});
  EXPECT_EQ(reg.search_dirs().size(), 1u);
  EXPECT_EQ(reg.plugins().size(), 1u);
  EXPECT_TRUE(reg.refused().empty());
}

TEST(RegistrySearchPath, MissingFolderIsSkippedQuietly) {
  TempDir tmp;
  Registry reg({tmp.path() / "does-not-exist"});
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_TRUE(reg.refused().empty());
  EXPECT_EQ(reg.search_dirs().size(), 1u);
}

}  // namespace
}  // namespace ferry::registry
