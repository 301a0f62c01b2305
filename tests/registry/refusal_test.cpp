// tests/registry/refusal_test.cpp: every way the registry refuses a plugin file, each with the
// exact reason it reports; the process survives every one of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ferry/sdk/error.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include "plugin_files.hpp"
#include "registry/registry.hpp"

namespace ferry::registry {
namespace {

using ferry::testing::TempDir;
using ::testing::HasSubstr;

// Scans a folder holding only `plugin` (copied under `as` when given) and returns its refusal.
Refusal refusal_of(const std::filesystem::path& plugin, const std::string& as = "") {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto copied = ferry::testing::copy_plugin(plugin, dir, as);
  Registry reg({dir});
  EXPECT_TRUE(reg.plugins().empty());
  if (reg.refused().size() != 1) {
    ADD_FAILURE() << "expected exactly one refusal, got " << reg.refused().size();
    return {};
  }
  EXPECT_EQ(reg.refused()[0].path, copied);
  return reg.refused()[0];
}

TEST(RegistryRefusal, TextFileIsNotALoadableSharedObject) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto text = ferry::testing::write_text_plugin(dir, "libferry_transport_text.so");
  Registry reg({dir});
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_EQ(reg.refused()[0].path, text);
  EXPECT_THAT(reg.refused()[0].reason, HasSubstr("not a loadable shared object: "));
  EXPECT_THAT(reg.refused()[0].reason, HasSubstr("invalid ELF header"));
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(RegistryRefusal, MissingEntrySymbolIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("noentry")).reason,
              HasSubstr("does not export the entry symbol ferry_plugin_negotiate"));
}

TEST(RegistryRefusal, OtherAbiMajorIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("wrongmajor")).reason,
              HasSubstr("implements plugin ABI 2." + std::to_string(FERRY_PLUGIN_ABI_MINOR) +
                        ", but this host implements major 1"));
}

TEST(RegistryRefusal, EmptyNegotiationAnswerIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("silent")).reason,
              HasSubstr("did not fill in its negotiation answer"));
}

TEST(RegistryRefusal, ShortFunctionTableIsRefused) {
  const auto reason = refusal_of(ferry::testing::broken("shorttable")).reason;
  EXPECT_THAT(reason, HasSubstr("function table is 16 bytes"));
  EXPECT_THAT(reason, HasSubstr("(short struct)"));
}

TEST(RegistryRefusal, NullRequiredFunctionIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("nullfn")).reason,
              HasSubstr("required function 'destroy' is NULL"));
}

TEST(RegistryRefusal, NameDifferentFromFileNameIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("alpha")).reason,
              HasSubstr("reports name 'beta', but its file name says 'alpha'"));
}

TEST(RegistryRefusal, KindDifferentFromFileNameIsRefused) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("kindswap", "model")).reason,
              HasSubstr("reports kind transport, but its file name says model"));
}

TEST(RegistryRefusal, PluginThatRefusesTheHostIsRefusedWithItsMessage) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("refuses")).reason,
              HasSubstr("refused the host: refuses: needs host ABI 1.7 or newer"));
}

TEST(RegistryRefusal, GarbageAnswerIsRefusedWithoutCrashing) {
  EXPECT_THAT(refusal_of(ferry::testing::broken("garbage")).reason,
              HasSubstr("its name pointer 0x10 is not a readable string"));
}

TEST(RegistryRefusal, WorldWritableFileIsRefused) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto copied = ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  ASSERT_EQ(::chmod(copied.c_str(), 0666), 0);
  Registry reg({dir});
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_THAT(reg.refused()[0].reason, HasSubstr("world-writable file (mode 0666)"));
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(RegistryRefusal, WorldWritableFolderIsRefused) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  Registry reg({dir});
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_THAT(reg.refused()[0].reason,
              HasSubstr("world-writable folder " + dir.string() + " (mode 0777)"));
}

TEST(RegistryRefusal, FileOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  const auto copied = ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir);
  ASSERT_EQ(::chown(copied.c_str(), 65534, 65534), 0);
  Registry reg({dir});
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_THAT(reg.refused()[0].reason,
              HasSubstr("file is owned by uid 65534, which is neither root nor the current user"));
}

TEST(RegistryRefusal, NameWithForbiddenCharactersIsRefused) {
  EXPECT_THAT(
      refusal_of(ferry::testing::mock_transport(), "libferry_transport_Mock.so").reason,
      HasSubstr("plugin name 'Mock' in file name 'libferry_transport_Mock.so' has characters "
                "outside [a-z0-9_-]"));
}

TEST(RegistryRefusal, SecondPluginOfTheSameNameIsShadowed) {
  TempDir tmp;
  const auto first = tmp.folder("first");
  const auto second = tmp.folder("second");
  const auto winner = ferry::testing::copy_plugin(ferry::testing::mock_transport(), first);
  const auto loser = ferry::testing::copy_plugin(ferry::testing::mock_transport(), second);
  Registry reg({first, second});
  ASSERT_EQ(reg.plugins().size(), 1u);
  EXPECT_EQ(reg.plugins()[0]->info().path, winner);
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_EQ(reg.refused()[0].path, loser);
  EXPECT_EQ(reg.refused()[0].reason, "shadowed by " + winner.string());
}

TEST(RegistryRefusal, RefusedPluginDoesNotShadowALaterGoodOne) {
  TempDir tmp;
  const auto first = tmp.folder("first");
  const auto second = tmp.folder("second");
  ferry::testing::write_text_plugin(first, "libferry_transport_mock.so");
  const auto good = ferry::testing::copy_plugin(ferry::testing::mock_transport(), second);
  Registry reg({first, second});
  ASSERT_EQ(reg.plugins().size(), 1u);
  EXPECT_EQ(reg.plugins()[0]->info().path, good);
  ASSERT_EQ(reg.refused().size(), 1u);
  EXPECT_THAT(reg.refused()[0].reason, HasSubstr("not a loadable shared object"));
}

TEST(RegistryRefusal, FilesNotNamedLikePluginsAreIgnored) {
  TempDir tmp;
  const auto dir = tmp.folder("plugins");
  ferry::testing::write_text_plugin(dir, "README.md");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir, "libother.so");
  ferry::testing::copy_plugin(ferry::testing::mock_transport(), dir,
                              "libferry_transport_mock.so.1");
  Registry reg({dir});
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_TRUE(reg.refused().empty());
}

TEST(RegistryLoadFile, ThrowsIncompatibleWithPathAndReason) {
  TempDir tmp;
  const auto copied =
      ferry::testing::copy_plugin(ferry::testing::broken("wrongmajor"), tmp.folder("p"));
  try {
    Registry::load_file(copied);
    FAIL() << "load_file accepted a plugin of ABI major 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INCOMPATIBLE);
    EXPECT_THAT(e.what(), HasSubstr(copied.string() + ": implements plugin ABI 2."));
  }
}

TEST(RegistryLoadFile, MissingFileIsNotFound) {
  try {
    Registry::load_file("/nonexistent/libferry_transport_none.so");
    FAIL() << "load_file accepted a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
    EXPECT_THAT(e.what(),
                HasSubstr("/nonexistent/libferry_transport_none.so: no such plugin file"));
  }
}

}  // namespace
}  // namespace ferry::registry
