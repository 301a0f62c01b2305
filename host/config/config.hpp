// config/config.hpp: the typed configuration of the `ferry` host (docs/config.md): defaults, a
// TOML file (`--config FILE`), and `--set key.path=value` overrides, each checked for unknown keys,
// wrong types and out-of-range values with an error that names the key and its line.
#pragma once

#include <ferry/plugin.h>

#include "common/progress.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::config {

// What happens to a tagged region's contents on release_memory_occupation.
enum class ReleasePolicy {
  discard,  // contents are dropped; resume gives zeroed memory until the next update
  backup,   // contents are copied to the host mirror and restored on resume
};

// When the host mirror takes its copy of a committed version (weights_policy backup): the
// rollback point of the next update and the backup of a release (docs/config.md, [memory]).
enum class MirrorRefresh {
  background,  // after the version is published, off the commit's critical path; an update that
               // begins before the copy landed pre-empts it (and fences if it fails); a release,
               // resume or restore waits for the copy to land first
  complete,    // the same, but the next update waits for the copy to land (always a rollback)
  commit,      // inside commit, before it returns (the update waits for the copy)
};

// How a session moves tensors into a receiver's parameters (docs/architecture.md, "Three ways to
// deliver").
enum class Delivery {
  // direct where the transport writes remote device memory and every plan is a pure copy; else
  // read in place by the receiver where the transport maps the sender's memory; else staged
  automatic,
  direct,  // the sender writes each tensor straight into its destination slice; else fail
  staged,  // always through staging slots; the receiver applies its plan from them
};

// How a receiver checks what a sender wrote straight into its parameters (direct delivery).
enum class DirectVerify {
  writer,  // take the fingerprints the writing copy computed from the words it stored (one read
           // of the data); read back only what came without them
  reread,  // read everything written back at commit and compare with the sender's fingerprints
};

enum class Layout {
  engine,  // the inference engine's fused layout (stacked MoE experts, merged qkv, ...)
  hf,      // the checkpoint's own (Hugging Face) names and shapes
};

struct ReceiverConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 30000;
  std::string token;               // "" = mutating routes need no token
  std::string device = "cpu";      // "cpu", "cuda" or "cuda:N"
  std::string model_path;          // "" = no model loaded at start
  std::string model_family;        // "" = detect from the model's config.json
  // How a model family is detected: "SUBSTRING=FAMILY", the first whose substring is in an
  // `architectures` entry or the `model_type` of config.json (lower case).
  std::vector<std::string> model_family_hints = {"moe=moe", "deepseek=moe", "llama=dense",
                                                 "qwen=dense", "mistral=dense"};
  // The model plugin of an embedded receiver (engine-owned parameters) whose config names none:
  // the sender's names are the parameter names.
  std::string embedded_model_family = "identity";
  Layout layout = Layout::engine;
  std::uint32_t tp_rank = 0;
  std::uint32_t tp_size = 1;
  std::uint32_t ep_rank = 0;
  std::uint32_t ep_size = 1;
  // The source transport (FERRY_TRANSPORT_CAP_SOURCE) that reads model_path and the checkpoints
  // of update_weights_from_disk: libferry_transport_<name>.so.
  std::string transport = "disk";
};

struct UpdateConfig {
  std::uint64_t bucket_bytes = 256ull << 20;
  std::uint32_t read_threads = 0;   // 0 = auto
  std::uint32_t apply_threads = 0;  // 0 = auto
  bool verify_fingerprints = true;
  Delivery delivery = Delivery::automatic;  // sender side: see Delivery
  DirectVerify direct_verify = DirectVerify::writer;  // receiver side: see DirectVerify
  // Both sides: a session is kept after its commit for the sender's next push of the same
  // tensors (the sender asks, the receiver agrees; docs/session-protocol.md, "Kept sessions").
  bool keep_sessions = true;
  // Sender side: a kept session the receiver suspended for a release rejoins when the receiver
  // says it resumed (on the sender's thread that watches it), not at the next push.
  bool rejoin_when_resumed = true;
  std::uint64_t bucket_timeout_ms = 60000;
  std::uint64_t commit_timeout_ms = 60000;
  // Receiver side: tensors /update_weights_from_tensor staged for an update that no call
  // completed are discarded this long after the last call (the client went away).
  std::uint64_t staged_tensors_timeout_ms = 300000;
  // Sender side: the data transport of a push ("auto", "inline" or a plugin name), and the
  // plugins "auto" tries in order, the first whose capabilities fit (session/transport_choice).
  // A vendor's plugin heads the list to be chosen before the in-tree ones.
  std::string transport = "auto";
  std::vector<std::string> transport_preference = {"cuda_ipc", "ucx"};
  // The broadcast transport of weight-update groups (ferry.NcclGroup,
  // /init_weights_update_group), and the source of /update_weights_from_ipc (the
  // checkpoint-engine protocol).
  std::string group_transport = "nccl";
  // The broadcast transport of weight-update groups whose backend is "gloo" (a group a torch
  // trainer created with torch.distributed; /init_weights_update_group's `backend`).
  std::string gloo_transport = "torch_gloo";
  std::string ckpt_engine_transport = "ckpt_engine";
};

struct MemoryConfig {
  ReleasePolicy weights_policy = ReleasePolicy::backup;
  ReleasePolicy staging_policy = ReleasePolicy::discard;
  std::string mirror_path;  // "" = anonymous memory; a file (e.g. under /dev/shm) = file-backed
  MirrorRefresh mirror_refresh = MirrorRefresh::background;
};

struct DemoConfig {
  std::uint32_t steps = 5;
  std::uint64_t hidden_size = 512;
  std::uint32_t layers = 8;
  std::uint64_t vocab_size = 8192;
  std::string transport = "auto";  // "auto", "inline", "disk" or a point-to-point plugin
  std::string device = "cpu";
};

// Free-form options of one plugin ([transport.<name>] or [model.<name>]): every value kept as a
// string (numbers in decimal, booleans as "true"/"false"); the plugin validates them.
using PluginOptions = std::map<std::string, std::string>;

struct Config {
  std::vector<std::string> plugin_dirs;  // searched before the environment and install dir
  std::string log_level = "info";        // trace, debug, info, warn, error, off
  // A file, --set or FERRY_LOG_LEVEL named log_level (an embedding program's default is "warn"
  // where nothing did: capi/config_source.cpp).
  bool log_level_given = false;
  // Progress of long pushes and loads (common/progress.hpp): auto, terminal, lines, never; the
  // lines (not on a terminal) this far apart.
  ProgressMode progress = ProgressMode::automatic;
  std::uint64_t progress_interval_ms = 5000;
  ReceiverConfig receiver;
  UpdateConfig update;
  MemoryConfig memory;
  DemoConfig demo;
  std::map<std::string, PluginOptions> transports;  // by plugin name
  std::map<std::string, PluginOptions> models;      // by plugin name
  // Where each plugin section and option was given, for messages: "transport.ucx.tls" ->
  // "receiver.toml:12" or "--set transport.ucx.tls=tcp".
  std::map<std::string, std::string> origins;
};

// Parses TOML text. `source_name` prefixes error messages ("config.toml:12: unknown key
// 'receiver.prot'"). Applies every rule, including the cross-key ones (see validate).
// Throws ferry::Error INVALID_ARGUMENT.
Config parse(std::string_view toml_text, std::string source_name);

// Reads and parses a file; errors name the path as given. Throws ferry::Error: NOT_FOUND / IO
// when the file cannot be read, INVALID_ARGUMENT for its content.
Config load_file(const std::string& path);

// Applies one "key.path=value" override (`--set`). The value is read as a TOML value of the
// key's type ("receiver.port=8000", "plugin_dirs=['/a','/b']", "update.verify_fingerprints=false");
// a string key also takes the bare text ("memory.weights_policy=discard"). Keys under
// transport.<name>. and model.<name>. are plugin options and are added. Checks the key's own
// type and range; the cross-key rules (tp_rank < tp_size) are left to validate(), so that the
// order of overrides does not matter. Throws ferry::Error INVALID_ARGUMENT naming the override.
void apply_override(Config& config, std::string_view key_eq_value);

// The environment's part: FERRY_LOG_LEVEL, when set and not empty, sets log_level (checked like
// the key; the error names FERRY_LOG_LEVEL). load() applies it after the file and before the
// overrides, so the precedence is: overrides (--set, the C API's), FERRY_LOG_LEVEL, the file.
void apply_environment(Config& config);

// Cross-key rules: receiver.tp_rank < tp_size, receiver.ep_rank < ep_size.
// Throws ferry::Error INVALID_ARGUMENT.
void validate(const Config& config);

// The usual sequence: defaults or `path` (when not empty), then apply_environment(), then each
// override in order, then validate().
Config load(const std::string& path, std::span<const std::string> overrides);

// Every key the config knows, with its type ("a string", "an integer", ...) and, for a key
// with a fixed set of spellings, those spellings (tests/docs holds docs/config.md to this list).
struct KeyInfo {
  std::string path;
  std::string kind;
  std::vector<std::string> choices;
};
std::vector<KeyInfo> known_keys();

const char* policy_name(ReleasePolicy policy) noexcept;  // "discard", "backup"
const char* mirror_refresh_name(MirrorRefresh refresh) noexcept;  // "background", "commit"
const char* layout_name(Layout layout) noexcept;         // "engine", "hf"

// The options as the plugin ABI takes them. Pointers point into `options`, which must outlive
// the result and stay unmodified.
std::vector<ferry_option_t> option_array(const PluginOptions& options);

}  // namespace ferry::config
