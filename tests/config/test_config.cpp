// Tests of the host config: defaults, a full file, every error kind with its line, `--set`
// overrides of each type, and the free-form [transport.<name>] / [model.<name>] sections.
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace fc = ferry::config;

namespace {

// The INVALID_ARGUMENT message parse() throws for `text` (fails the test if none).
std::string parse_error(const std::string& text) {
  try {
    fc::parse(text, "config.toml");
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "parse accepted:\n" << text;
  return {};
}

std::string override_error(fc::Config& config, const std::string& key_eq_value) {
  try {
    fc::apply_override(config, key_eq_value);
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "override accepted: " << key_eq_value;
  return {};
}

// A fresh folder under the test's temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ferry-config-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

TEST(ConfigDefaults, MatchTheDocumentedValues) {
  const fc::Config c = fc::parse("", "empty.toml");
  EXPECT_TRUE(c.plugin_dirs.empty());
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.receiver.host, "127.0.0.1");
  EXPECT_EQ(c.receiver.port, 30000);
  EXPECT_EQ(c.receiver.token, "");
  EXPECT_EQ(c.receiver.device, "cpu");
  EXPECT_EQ(c.receiver.model_path, "");
  EXPECT_EQ(c.receiver.model_family, "");
  EXPECT_EQ(c.receiver.layout, fc::Layout::engine);
  EXPECT_EQ(c.receiver.tp_rank, 0u);
  EXPECT_EQ(c.receiver.tp_size, 1u);
  EXPECT_EQ(c.receiver.ep_rank, 0u);
  EXPECT_EQ(c.receiver.ep_size, 1u);
  EXPECT_EQ(c.receiver.transport, "disk");
  EXPECT_EQ(c.update.bucket_bytes, 256ull << 20);
  EXPECT_EQ(c.update.read_threads, 0u);
  EXPECT_EQ(c.update.apply_threads, 0u);
  EXPECT_TRUE(c.update.verify_fingerprints);
  EXPECT_TRUE(c.update.keep_sessions);
  EXPECT_TRUE(c.update.rejoin_when_resumed);
  EXPECT_EQ(c.update.delivery, fc::Delivery::automatic);
  EXPECT_EQ(c.update.direct_verify, fc::DirectVerify::writer);
  EXPECT_EQ(c.update.bucket_timeout_ms, 60000u);
  EXPECT_EQ(c.update.commit_timeout_ms, 60000u);
  EXPECT_EQ(c.memory.weights_policy, fc::ReleasePolicy::backup);
  EXPECT_EQ(c.memory.staging_policy, fc::ReleasePolicy::discard);
  EXPECT_EQ(c.memory.mirror_path, "");
  EXPECT_EQ(c.memory.mirror_refresh, fc::MirrorRefresh::background);
  EXPECT_EQ(c.demo.steps, 5u);
  EXPECT_EQ(c.demo.hidden_size, 512u);
  EXPECT_EQ(c.demo.layers, 8u);
  EXPECT_EQ(c.demo.vocab_size, 8192u);
  EXPECT_EQ(c.demo.transport, "auto");
  EXPECT_EQ(c.demo.device, "cpu");
  EXPECT_TRUE(c.transports.empty());
  EXPECT_TRUE(c.models.empty());
}

TEST(ConfigFile, FullFileSetsEveryKey) {
  TempDir dir;
  const std::string path = dir.write("full.toml", R"(
plugin_dirs = ["/opt/ferry/plugins", "/home/me/plugins"]
log_level = "debug"

[receiver]
host = "0.0.0.0"
port = 8000
token = "s3cret"
device = "cuda:1"
model_path = "/models/qwen"
model_family = "moe"
layout = "hf"
tp_rank = 1
tp_size = 2
ep_rank = 3
ep_size = 4
transport = "nccl"

[update]
bucket_bytes = 1073741824
read_threads = 8
apply_threads = 2
verify_fingerprints = false
delivery = "staged"
direct_verify = "reread"
bucket_timeout_ms = 5000
commit_timeout_ms = 7000

[memory]
weights_policy = "discard"
staging_policy = "backup"
mirror_path = "/dev/shm/ferry-mirror"
mirror_refresh = "commit"

[demo]
steps = 9
hidden_size = 512
layers = 2
vocab_size = 1000
transport = "ucx"
device = "cuda"
)");
  const fc::Config c = fc::load_file(path);
  EXPECT_EQ(c.plugin_dirs, (std::vector<std::string>{"/opt/ferry/plugins", "/home/me/plugins"}));
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.receiver.host, "0.0.0.0");
  EXPECT_EQ(c.receiver.port, 8000);
  EXPECT_EQ(c.receiver.token, "s3cret");
  EXPECT_EQ(c.receiver.device, "cuda:1");
  EXPECT_EQ(c.receiver.model_path, "/models/qwen");
  EXPECT_EQ(c.receiver.model_family, "moe");
  EXPECT_EQ(c.receiver.layout, fc::Layout::hf);
  EXPECT_EQ(c.receiver.tp_rank, 1u);
  EXPECT_EQ(c.receiver.tp_size, 2u);
  EXPECT_EQ(c.receiver.ep_rank, 3u);
  EXPECT_EQ(c.receiver.ep_size, 4u);
  EXPECT_EQ(c.receiver.transport, "nccl");
  EXPECT_EQ(c.update.bucket_bytes, 1ull << 30);
  EXPECT_EQ(c.update.read_threads, 8u);
  EXPECT_EQ(c.update.apply_threads, 2u);
  EXPECT_FALSE(c.update.verify_fingerprints);
  EXPECT_EQ(c.update.delivery, fc::Delivery::staged);
  EXPECT_EQ(c.update.direct_verify, fc::DirectVerify::reread);
  EXPECT_EQ(c.update.bucket_timeout_ms, 5000u);
  EXPECT_EQ(c.update.commit_timeout_ms, 7000u);
  EXPECT_EQ(c.memory.weights_policy, fc::ReleasePolicy::discard);
  EXPECT_EQ(c.memory.staging_policy, fc::ReleasePolicy::backup);
  EXPECT_EQ(c.memory.mirror_path, "/dev/shm/ferry-mirror");
  EXPECT_EQ(c.memory.mirror_refresh, fc::MirrorRefresh::commit);
  EXPECT_EQ(c.demo.steps, 9u);
  EXPECT_EQ(c.demo.hidden_size, 512u);
  EXPECT_EQ(c.demo.layers, 2u);
  EXPECT_EQ(c.demo.vocab_size, 1000u);
  EXPECT_EQ(c.demo.transport, "ucx");
  EXPECT_EQ(c.demo.device, "cuda");
}

TEST(ConfigFile, DottedKeysWorkLikeSections) {
  const fc::Config c = fc::parse("receiver.port = 1234\nupdate.read_threads = 3\n", "x.toml");
  EXPECT_EQ(c.receiver.port, 1234);
  EXPECT_EQ(c.update.read_threads, 3u);
}

TEST(ConfigFile, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.path() + "/absent.toml";
  try {
    fc::load_file(path);
    FAIL() << "loaded a missing file";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(ConfigFile, ErrorsNameThePathAsGiven) {
  TempDir dir;
  const std::string path = dir.write("bad.toml", "\n\nlog_level = 3\n");
  try {
    fc::load_file(path);
    FAIL() << "accepted a wrong type";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":3: 'log_level' must be a string, got integer");
  }
}

// ---- errors, each with its line -----------------------------------------------------------

TEST(ConfigErrors, UnknownKeyInSection) {
  EXPECT_EQ(parse_error("[receiver]\nport = 1\n\n\n\n\n\n\n\n\n\nprot = 8000\n"),
            "config.toml:12: unknown key 'receiver.prot'; did you mean 'receiver.port'?");
}

TEST(ConfigErrors, UnknownTopLevelKey) {
  EXPECT_EQ(parse_error("log_level = 'info'\nplugin_dir = ['/a']\n"),
            "config.toml:2: unknown key 'plugin_dir'; did you mean 'plugin_dirs'?");
}

TEST(ConfigErrors, UnknownSection) {
  EXPECT_EQ(parse_error("log_level = 'info'\n[recevier]\nport = 1\n"),
            "config.toml:2: unknown key 'recevier'; did you mean 'receiver'?");
}

TEST(ConfigErrors, UnknownKeyNamesTheNearestKnownOne) {
  // Same name in another section.
  EXPECT_EQ(parse_error("[receiver]\nbucket_bytes = 1\n"),
            "config.toml:2: unknown key 'receiver.bucket_bytes'; did you mean "
            "'update.bucket_bytes'?");
  EXPECT_EQ(parse_error("[update]\nverify_fingerprint = true\n"),
            "config.toml:2: unknown key 'update.verify_fingerprint'; did you mean "
            "'update.verify_fingerprints'?");
  // Nothing near: the section's keys are listed.
  EXPECT_EQ(parse_error("[demo]\nmodel = 'x'\n"),
            "config.toml:2: unknown key 'demo.model' (the keys of [demo]: steps, hidden_size, "
            "layers, vocab_size, transport, device)");
  EXPECT_EQ(parse_error("whatever = 1\n"), "config.toml:1: unknown key 'whatever'");
}

TEST(ConfigErrors, WrongTypeNamesExpectedAndActual) {
  EXPECT_EQ(parse_error("[receiver]\nhost = 'h'\nport = \"8000\"\n"),
            "config.toml:3: 'receiver.port' must be an integer, got string");
  EXPECT_EQ(parse_error("[update]\nverify_fingerprints = 1\n"),
            "config.toml:2: 'update.verify_fingerprints' must be a boolean, got integer");
  EXPECT_EQ(parse_error("[receiver]\nhost = 1.5\n"),
            "config.toml:2: 'receiver.host' must be a string, got float");
  EXPECT_EQ(parse_error("plugin_dirs = '/a'\n"),
            "config.toml:1: 'plugin_dirs' must be an array of strings, got string");
  EXPECT_EQ(parse_error("plugin_dirs = ['/a', 2]\n"),
            "config.toml:1: 'plugin_dirs[1]' must be a string, got integer");
}

TEST(ConfigErrors, SectionThatIsNotATable) {
  EXPECT_EQ(parse_error("log_level = 'info'\nreceiver = 5\n"),
            "config.toml:2: 'receiver' must be a table, got integer");
}

TEST(ConfigErrors, PortOutOfRange) {
  EXPECT_EQ(parse_error("[receiver]\nport = 65536\n"),
            "config.toml:2: 'receiver.port' must be in [0, 65535], got 65536");
  EXPECT_EQ(parse_error("[receiver]\nport = -1\n"),
            "config.toml:2: 'receiver.port' must be in [0, 65535], got -1");
  EXPECT_EQ(fc::parse("[receiver]\nport = 65535\n", "x").receiver.port, 65535);
  EXPECT_EQ(fc::parse("[receiver]\nport = 0\n", "x").receiver.port, 0);
}

TEST(ConfigErrors, SizesAndCountsOutOfRange) {
  EXPECT_EQ(parse_error("[receiver]\ntp_size = 0\n"),
            "config.toml:2: 'receiver.tp_size' must be in [1, 4294967295], got 0");
  EXPECT_EQ(parse_error("[update]\nbucket_bytes = 0\n"),
            "config.toml:2: 'update.bucket_bytes' must be in [1, 9223372036854775807], got 0");
  EXPECT_EQ(parse_error("[update]\nread_threads = 5000\n"),
            "config.toml:2: 'update.read_threads' must be in [0, 1024], got 5000");
}

TEST(ConfigErrors, RankMustBeBelowSize) {
  EXPECT_EQ(parse_error("[receiver]\ntp_size = 2\n\ntp_rank = 2\n"),
            "config.toml:4: 'receiver.tp_rank' 2 must be < 'receiver.tp_size' 2");
  EXPECT_EQ(parse_error("[receiver]\nep_rank = 1\n"),
            "config.toml:2: 'receiver.ep_rank' 1 must be < 'receiver.ep_size' 1");
}

TEST(ConfigErrors, PolicyMustBeKnown) {
  EXPECT_EQ(parse_error("[memory]\n\nweights_policy = 'keep'\n"),
            "config.toml:3: 'memory.weights_policy' must be one of discard, backup; got 'keep'");
  EXPECT_EQ(parse_error("[receiver]\nlayout = 'megatron'\n"),
            "config.toml:2: 'receiver.layout' must be one of engine, hf; got 'megatron'");
}

TEST(ConfigErrors, MirrorRefreshMustBeKnown) {
  EXPECT_EQ(parse_error("[memory]\nweights_policy = 'backup'\nmirror_refresh = 'lazy'\n"),
            "config.toml:3: 'memory.mirror_refresh' must be one of background, complete, commit; got 'lazy'");
  EXPECT_EQ(parse_error("[memory]\nmirror_refresh = true\n"),
            "config.toml:2: 'memory.mirror_refresh' must be a string, got boolean");
  fc::Config c;
  EXPECT_EQ(override_error(c, "memory.mirror_refresh=sync"),
            "--set memory.mirror_refresh=sync: 'memory.mirror_refresh' must be one of background, "
            "complete, commit; got 'sync'");
  EXPECT_EQ(c.memory.mirror_refresh, fc::MirrorRefresh::background);
  fc::apply_override(c, "memory.mirror_refresh=commit");
  EXPECT_EQ(c.memory.mirror_refresh, fc::MirrorRefresh::commit);
  EXPECT_STREQ(fc::mirror_refresh_name(c.memory.mirror_refresh), "commit");
  fc::apply_override(c, "memory.mirror_refresh='background'");
  EXPECT_EQ(c.memory.mirror_refresh, fc::MirrorRefresh::background);
  EXPECT_STREQ(fc::mirror_refresh_name(c.memory.mirror_refresh), "background");
}

TEST(ConfigErrors, StringRules) {
  EXPECT_EQ(parse_error("log_level = 'loud'\n"),
            "config.toml:1: 'log_level' must be one of trace, debug, info, warn, error, off; "
            "got 'loud'");
  EXPECT_EQ(parse_error("[receiver]\ndevice = 'gpu0'\n"),
            "config.toml:2: 'receiver.device' must be 'cpu', 'cuda' or 'cuda:N'; got 'gpu0'");
  EXPECT_EQ(parse_error("[memory]\nmirror_path = 'shm/x'\n"),
            "config.toml:2: 'memory.mirror_path' must be an absolute path (or empty); got "
            "'shm/x'");
  EXPECT_EQ(parse_error("[receiver]\nhost = ''\n"),
            "config.toml:2: 'receiver.host' must not be empty; got ''");
}

TEST(ConfigErrors, TomlSyntaxErrorHasItsLine) {
  const std::string message = parse_error("[receiver]\nport = 80\nhost = \n");
  EXPECT_EQ(message.rfind("config.toml:3: ", 0), 0u) << message;
}

TEST(ConfigErrors, DuplicateKeyIsASyntaxError) {
  const std::string message = parse_error("[receiver]\nport = 80\nport = 81\n");
  EXPECT_EQ(message.rfind("config.toml:3: ", 0), 0u) << message;
}

// ---- overrides ----------------------------------------------------------------------------

TEST(ConfigOverride, IntegerKey) {
  fc::Config c;
  fc::apply_override(c, "receiver.port=8000");
  EXPECT_EQ(c.receiver.port, 8000);
  fc::apply_override(c, " update.bucket_bytes = 4096 ");
  EXPECT_EQ(c.update.bucket_bytes, 4096u);
}

TEST(ConfigOverride, BareAndQuotedStrings) {
  fc::Config c;
  fc::apply_override(c, "memory.weights_policy=discard");
  EXPECT_EQ(c.memory.weights_policy, fc::ReleasePolicy::discard);
  fc::apply_override(c, "receiver.host='10.0.0.1'");
  EXPECT_EQ(c.receiver.host, "10.0.0.1");
  fc::apply_override(c, "receiver.token=\"a=b\"");
  EXPECT_EQ(c.receiver.token, "a=b");
  fc::apply_override(c, "receiver.token=123");  // bare text is the string, even if numeric
  EXPECT_EQ(c.receiver.token, "123");
  fc::apply_override(c, "receiver.model_path=/models/a b");
  EXPECT_EQ(c.receiver.model_path, "/models/a b");
  fc::apply_override(c, "receiver.model_family=");
  EXPECT_EQ(c.receiver.model_family, "");
}

TEST(ConfigOverride, BooleanKey) {
  fc::Config c;
  fc::apply_override(c, "update.verify_fingerprints=false");
  EXPECT_FALSE(c.update.verify_fingerprints);
  fc::apply_override(c, "update.keep_sessions=false");
  EXPECT_FALSE(c.update.keep_sessions);
  fc::apply_override(c, "update.rejoin_when_resumed=false");
  EXPECT_FALSE(c.update.rejoin_when_resumed);
  fc::apply_override(c, "update.verify_fingerprints=true");
  EXPECT_TRUE(c.update.verify_fingerprints);
}

TEST(ConfigOverride, StringArrayKey) {
  fc::Config c;
  fc::apply_override(c, "plugin_dirs=['/a','/b']");
  EXPECT_EQ(c.plugin_dirs, (std::vector<std::string>{"/a", "/b"}));
  fc::apply_override(c, "plugin_dirs=[]");
  EXPECT_TRUE(c.plugin_dirs.empty());
}

TEST(ConfigOverride, WrongTypeNamesTheOverride) {
  fc::Config c;
  EXPECT_EQ(override_error(c, "receiver.port=http"),
            "--set receiver.port=http: 'receiver.port' must be an integer, got string");
  EXPECT_EQ(override_error(c, "update.verify_fingerprints=1"),
            "--set update.verify_fingerprints=1: 'update.verify_fingerprints' must be a boolean, "
            "got integer");
  EXPECT_EQ(override_error(c, "plugin_dirs=/a"),
            "--set plugin_dirs=/a: 'plugin_dirs' must be an array of strings, got string");
  EXPECT_EQ(override_error(c, "receiver.port=70000"),
            "--set receiver.port=70000: 'receiver.port' must be in [0, 65535], got 70000");
  EXPECT_EQ(override_error(c, "memory.staging_policy=keep"),
            "--set memory.staging_policy=keep: 'memory.staging_policy' must be one of discard, "
            "backup; got 'keep'");
  EXPECT_EQ(c.receiver.port, 30000) << "a rejected override must not change the config";
}

TEST(ConfigOverride, ValueCannotSmuggleInAnotherKey) {
  fc::Config c;
  EXPECT_EQ(override_error(c, "receiver.port=1\nlog_level = 'off'"),
            "--set receiver.port=1\nlog_level = 'off': 'receiver.port' must be an integer, got "
            "string");
  EXPECT_EQ(c.log_level, "info");
}

TEST(ConfigOverride, UnknownKey) {
  fc::Config c;
  EXPECT_EQ(override_error(c, "receiver.prot=8000"),
            "--set receiver.prot=8000: unknown key 'receiver.prot'; did you mean "
            "'receiver.port'?");
  EXPECT_EQ(override_error(c, "memory=1"),
            "--set memory=1: unknown key 'memory' ([memory] is a section; its keys: "
            "weights_policy, staging_policy, mirror_path, mirror_refresh)");
  EXPECT_EQ(override_error(c, "transport.disk=1"),
            "--set transport.disk=1: unknown key 'transport.disk' (plugin options are "
            "transport.<name>.<key>)");
}

TEST(ConfigOverride, MissingEquals) {
  fc::Config c;
  EXPECT_EQ(override_error(c, "receiver.port"), "--set receiver.port: expected key.path=value");
  EXPECT_EQ(override_error(c, "=5"), "--set =5: expected key.path=value");
}

TEST(ConfigOverride, RankRuleIsCheckedAfterAllOverrides) {
  // Order must not matter: tp_rank before tp_size is fine once both are applied.
  const std::vector<std::string> overrides = {"receiver.tp_rank=3", "receiver.tp_size=4"};
  const fc::Config c = fc::load("", overrides);
  EXPECT_EQ(c.receiver.tp_rank, 3u);
  EXPECT_EQ(c.receiver.tp_size, 4u);
  try {
    fc::load("", std::vector<std::string>{"receiver.tp_rank=4", "receiver.tp_size=4"});
    FAIL() << "accepted tp_rank == tp_size";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(std::string(e.what()), "'receiver.tp_rank' 4 must be < 'receiver.tp_size' 4");
  }
}

TEST(ConfigOverride, LoadAppliesOverridesOverTheFile) {
  TempDir dir;
  const std::string path = dir.write("c.toml", "[receiver]\nport = 9000\nhost = 'h'\n");
  const fc::Config c = fc::load(path, std::vector<std::string>{"receiver.port=9001"});
  EXPECT_EQ(c.receiver.port, 9001);
  EXPECT_EQ(c.receiver.host, "h");
}

// ---- plugin sections ----------------------------------------------------------------------

TEST(ConfigPlugins, TransportAndModelSectionsPassThroughAsStrings) {
  const fc::Config c = fc::parse(R"(
[transport.disk]
path = "/data/ckpt"
chunk_bytes = 1048576
odirect = true
ratio = 0.25

[transport.ucx]
tls = "tcp,sm"

[model.moe]
fuse_experts = false
)",
                                 "p.toml");
  ASSERT_EQ(c.transports.size(), 2u);
  const fc::PluginOptions& disk = c.transports.at("disk");
  EXPECT_EQ(disk.at("path"), "/data/ckpt");
  EXPECT_EQ(disk.at("chunk_bytes"), "1048576");
  EXPECT_EQ(disk.at("odirect"), "true");
  EXPECT_EQ(disk.at("ratio"), "0.25");
  EXPECT_EQ(c.transports.at("ucx").at("tls"), "tcp,sm");
  EXPECT_EQ(c.models.at("moe").at("fuse_experts"), "false");

  const auto options = fc::option_array(disk);
  ASSERT_EQ(options.size(), 4u);
  EXPECT_STREQ(options[0].key, "chunk_bytes");
  EXPECT_STREQ(options[0].value, "1048576");
  EXPECT_EQ(options[0].key, disk.find("chunk_bytes")->first.c_str());
}

TEST(ConfigPlugins, NestedValuesAreRejected) {
  EXPECT_EQ(parse_error("[transport.disk]\nlist = [1, 2]\n"),
            "config.toml:2: 'transport.disk.list' must be a string, number or boolean, got array");
  EXPECT_EQ(parse_error("[transport]\ndisk = 5\n"),
            "config.toml:2: 'transport.disk' must be a table, got integer");
  EXPECT_EQ(parse_error("transport = 5\n"),
            "config.toml:1: 'transport' must be a table of [transport.<name>] sections, got "
            "integer");
}

TEST(ConfigPlugins, PluginNameMustBePlain) {
  EXPECT_EQ(parse_error("[transport.\"../evil\"]\nx = 1\n"),
            "config.toml:1: 'transport.../evil': a plugin name must be letters, digits, '_' or "
            "'-'");
}

TEST(ConfigPlugins, OverridesAddOptions) {
  fc::Config c;
  fc::apply_override(c, "transport.disk.path=/data/x");
  fc::apply_override(c, "transport.disk.chunk_bytes=4096");
  fc::apply_override(c, "transport.disk.label='quoted'");
  fc::apply_override(c, "model.dense.tie_embeddings=true");
  EXPECT_EQ(c.transports.at("disk").at("path"), "/data/x");
  EXPECT_EQ(c.transports.at("disk").at("chunk_bytes"), "4096");
  EXPECT_EQ(c.transports.at("disk").at("label"), "quoted");
  EXPECT_EQ(c.models.at("dense").at("tie_embeddings"), "true");
  EXPECT_EQ(override_error(c, "transport.a/b.x=1"),
            "--set transport.a/b.x=1: 'transport.a/b': a plugin name must be letters, digits, "
            "'_' or '-'");
}

TEST(ConfigPlugins, OriginsNameWhereEachOptionWasGiven) {
  fc::Config c = fc::parse("[transport.ucx]\n\ntls = 'tcp'\n", "a.toml");
  fc::apply_override(c, "model.moe.dtype=bf16");
  EXPECT_EQ(c.origins.at("transport.ucx"), "a.toml:1");
  EXPECT_EQ(c.origins.at("transport.ucx.tls"), "a.toml:3");
  EXPECT_EQ(c.origins.at("model.moe.dtype"), "--set model.moe.dtype=bf16");
  EXPECT_EQ(c.origins.at("model.moe"), "--set model.moe.dtype=bf16");
}

// ---- the log level: overrides over FERRY_LOG_LEVEL over the file ---------------------------

class LogLevelEnvironment : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv("FERRY_LOG_LEVEL"); }
};

TEST_F(LogLevelEnvironment, SitsBetweenTheFileAndTheOverrides) {
  TempDir dir;
  const std::string path = dir.write("l.toml", "log_level = 'error'\n");
  EXPECT_EQ(fc::load(path, {}).log_level, "error");
  ::setenv("FERRY_LOG_LEVEL", "debug", 1);
  EXPECT_EQ(fc::load(path, {}).log_level, "debug");
  EXPECT_EQ(fc::load("", {}).log_level, "debug");
  EXPECT_EQ(fc::load(path, std::vector<std::string>{"log_level=warn"}).log_level, "warn");
  ::setenv("FERRY_LOG_LEVEL", "", 1);  // empty: not set
  EXPECT_EQ(fc::load(path, {}).log_level, "error");
}

TEST_F(LogLevelEnvironment, ABadLevelIsNamedWithTheVariable) {
  ::setenv("FERRY_LOG_LEVEL", "chatty", 1);
  try {
    fc::load("", {});
    ADD_FAILURE() << "FERRY_LOG_LEVEL=chatty accepted";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(e.what()),
              "FERRY_LOG_LEVEL: 'log_level' must be one of trace, debug, info, warn, error, off; "
              "got 'chatty'");
  }
}

// ---- [demo] transport: auto, inline, disk or any plugin name -------------------------------

TEST(ConfigDemo, TransportIsAnyNameButEmpty) {
  for (const char* name : {"auto", "inline", "disk", "cuda_ipc", "vendor_rdma"}) {
    EXPECT_EQ(fc::parse(fmt::format("[demo]\ntransport = '{}'\n", name), "d.toml").demo.transport,
              name);
  }
  EXPECT_EQ(parse_error("[demo]\ntransport = ''\n"),
            "config.toml:2: 'demo.transport' must not be empty; got ''");
}
