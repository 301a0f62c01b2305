// tests/config/plugin_sections_test.cpp: [transport.<name>] / [model.<name>] sections held to the
// option keys the plugins declare (plugin ABI 1.3), with the registry over the real in-tree
// plugins and the test mocks (which declare none): unknown keys and unknown plugins are refused
// with their names, whether or not that plugin is the one in use.
#include <ferry/sdk/error.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/plugin_sections.hpp"
#include "common/host_api.hpp"
#include "registry/loader.hpp"
#include "registry/registry.hpp"

namespace fc = ferry::config;
using ::testing::HasSubstr;

namespace {

std::vector<std::filesystem::path> env_dirs(const char* name) {
  const char* joined = std::getenv(name);
  std::vector<std::filesystem::path> dirs;
  std::string rest = joined != nullptr ? joined : "";
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    dirs.emplace_back(rest.substr(0, colon));
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
  }
  return dirs;
}

const ferry::registry::Registry& registry() {
  static const ferry::registry::Registry reg = [] {
    auto dirs = env_dirs("FERRY_IN_TREE_PLUGIN_DIRS");
    dirs.push_back(std::getenv("FERRY_TEST_PLUGIN_DIR"));
    return ferry::registry::Registry(dirs);
  }();
  return reg;
}

// The error check_plugin_sections raises for `toml` (with `overrides`), or "" when it passes.
std::string check(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    fc::Config c = fc::parse(toml, "c.toml");
    for (const auto& o : overrides) fc::apply_override(c, o);
    fc::check_plugin_sections(c, registry());
  } catch (const ferry::Error& e) {
    return std::string(e.what()) + " [" + ferry::status_name(e.code()) + "]";
  }
  return {};
}

TEST(PluginSections, PluginsDeclareTheirOptionKeys) {
  const auto disk = registry().transport("disk");
  ASSERT_TRUE(disk->info().option_keys.has_value());
  EXPECT_EQ(*disk->info().option_keys, std::vector<std::string>{"read_threads"});
  const auto moe = registry().model("moe");
  ASSERT_TRUE(moe->info().option_keys.has_value());
  EXPECT_EQ(*moe->info().option_keys, std::vector<std::string>{"dtype"});
  const auto identity = registry().model("identity");
  ASSERT_TRUE(identity->info().option_keys.has_value());
  EXPECT_TRUE(identity->info().option_keys->empty());
  EXPECT_FALSE(registry().transport("mock")->info().option_keys.has_value());
}

TEST(PluginSections, DeclaredKeysPass) {
  EXPECT_EQ(check("[transport.disk]\nread_threads = 4\n[model.moe]\ndtype = 'bf16'\n"
                  "[model.lowbit]\nscale_fmt = 'ue8m0'\n"),
            "");
  EXPECT_EQ(check("", {"transport.disk.read_threads=2", "model.dense.dtype=f32"}), "");
}

TEST(PluginSections, AnUnknownKeyOfAPluginNotInUseIsRefused) {
  // The config's default transport is disk and no model is named: moe is not in use.
  const std::string moe = check("\n[model.moe]\nfuse_experts = false\n");
  EXPECT_THAT(moe, HasSubstr("c.toml:3: unknown key 'model.moe.fuse_experts' (options of model "
                             "plugin 'moe', "));
  EXPECT_THAT(moe, HasSubstr("libferry_model_moe.so: dtype) [INVALID_ARGUMENT]"));
  EXPECT_THAT(check("[transport.disk]\nodirect = true\n"),
              HasSubstr("c.toml:2: unknown key 'transport.disk.odirect' (options of transport "
                        "plugin 'disk'"));
}

TEST(PluginSections, TheNearestDeclaredKeyIsNamed) {
  EXPECT_THAT(check("", {"transport.disk.read_thread=2"}),
              HasSubstr("--set transport.disk.read_thread=2: unknown key "
                        "'transport.disk.read_thread'; did you mean "
                        "'transport.disk.read_threads'? (options of transport plugin 'disk'"));
}

TEST(PluginSections, APluginThatTakesNoOptionsSaysSo) {
  EXPECT_THAT(check("[model.identity]\nx = 1\n"),
              HasSubstr("c.toml:2: unknown key 'model.identity.x' (model plugin 'identity', "));
  EXPECT_THAT(check("[model.identity]\nx = 1\n"), HasSubstr(", takes no options)"));
}

TEST(PluginSections, APluginNotFoundIsRefusedWithWhereFerryLooked) {
  const std::string missing = check("[transport.rdma9]\nqueue = 4\n");
  EXPECT_THAT(missing, HasSubstr("c.toml:1: section [transport.rdma9]: no transport plugin "
                                 "'rdma9' (libferry_transport_rdma9.so) in "));
  EXPECT_THAT(missing, HasSubstr(std::getenv("FERRY_TEST_PLUGIN_DIR")));
  EXPECT_THAT(missing, HasSubstr("available: "));
  EXPECT_THAT(missing, HasSubstr("[NOT_FOUND]"));
  EXPECT_THAT(check("", {"model.qwen9.x=1"}),
              HasSubstr("--set model.qwen9.x=1: section [model.qwen9]: no model plugin 'qwen9'"));
}

TEST(PluginSections, APluginThatDeclaresNothingIsLeftToItsCreate) {
  EXPECT_EQ(check("[transport.mock]\nanything = 1\n"), "");
}

// The host reads a plugin's option_keys without trusting it: a bad list is a refusal.
TEST(PluginSections, AHostileOptionKeysListIsRefusedNotFollowed) {
  using ferry::registry::read_option_keys;
  ferry_plugin_negotiation_t answer = ferry::registry::host_negotiation(ferry::host_api_table());
  std::optional<std::vector<std::string>> keys;
  EXPECT_EQ(read_option_keys(answer, &keys), std::nullopt);  // NULL: not declared
  EXPECT_FALSE(keys.has_value());

  static const char* const good[] = {"a", "bb", nullptr};
  answer.option_keys = good;
  EXPECT_EQ(read_option_keys(answer, &keys), std::nullopt);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "bb"}));

  answer.option_keys = reinterpret_cast<const char* const*>(std::uintptr_t{0x10});
  EXPECT_THAT(read_option_keys(answer, &keys).value_or(""),
              HasSubstr("its option_keys entry 0 at 0x10 is not readable memory"));
  EXPECT_FALSE(keys.has_value());

  static const char* const empty_key[] = {"a", "", nullptr};
  answer.option_keys = empty_key;
  EXPECT_THAT(read_option_keys(answer, &keys).value_or(""),
              HasSubstr("its option_keys entry 1 is not a readable, non-empty string"));

  static const char* const unreadable_key[] = {reinterpret_cast<const char*>(std::uintptr_t{8}),
                                               nullptr};
  answer.option_keys = unreadable_key;
  EXPECT_THAT(read_option_keys(answer, &keys).value_or(""),
              HasSubstr("its option_keys entry 0 is not a readable"));

  std::vector<const char*> endless(300, "k");
  answer.option_keys = endless.data();
  EXPECT_THAT(read_option_keys(answer, &keys).value_or(""),
              HasSubstr("its option_keys list has no NULL among its first 256 entries"));
}

}  // namespace
