// memory.mirror_path in a receiver over engine-owned parameters (the embedded receiver of the C
// API and Python): the engine holds the weights, so no mirror file is made or restored, and a
// warning says so instead of ignoring the setting.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "common/log.hpp"
#include "config/config.hpp"
#include "receiver/receiver.hpp"
#include "registry/registry.hpp"
#include "serve_fixture.hpp"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;

TEST(ReceiverMirrorPath, OverEngineOwnedParametersItIsNotUsedAndAWarningSaysSo) {
  const fs::path identity = required_env("FERRY_IDENTITY_PLUGIN");
  TempDir dir;
  config::Config config;
  config.receiver.model_family = "identity";
  config.memory.mirror_path = dir.file("mirror");
  registry::Registry registry({identity.parent_path()});
  receiver::Receiver receiver(config, registry);

  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  logger("receiver")->sinks().push_back(sink);
  std::vector<float> weights(64, 1.5f);
  receiver::Receiver::EngineParam param;
  param.name = "w";
  param.dtype = FERRY_DTYPE_F32;
  param.shape = {8, 8};
  param.data = weights.data();
  receiver.register_params({param});
  logger("receiver")->sinks().pop_back();

  EXPECT_NE(log.str().find("memory.mirror_path " + dir.file("mirror") +
                           " is not used: the weights are the engine's own parameters"),
            std::string::npos)
      << log.str();
  EXPECT_FALSE(fs::exists(dir.file("mirror")));
  EXPECT_EQ(receiver.layout().size(), 1u);
}

}  // namespace
}  // namespace ferry::test
