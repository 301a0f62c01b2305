// The config loader: TOML text and `--set` overrides into a checked ferry::config::Config. One
// table of known keys (kKeys) drives both, so a key is spelled, typed and range-checked in one
// place.
#include "config/config.hpp"

#include "config/suggest.hpp"

#include <ferry/sdk/error.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

namespace ferry::config {
namespace {

enum class Kind { string, integer, boolean, string_array };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::string: return "a string";
    case Kind::integer: return "an integer";
    case Kind::boolean: return "a boolean";
    case Kind::string_array: return "an array of strings";
  }
  return "?";
}

const char* type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// A broken rule, without its location; the caller prefixes "file:line: " or "--set ...: ".
struct Rule {
  std::string message;
};

// Sets one field from a TOML node of any type, or returns the broken rule.
using Setter = std::function<std::optional<Rule>(Config&, const toml::node&)>;

struct Key {
  std::string_view path;
  Kind kind;
  Setter set;
  std::vector<std::string_view> choices = {};  // the spellings a choice key takes, else empty
};

Rule wrong_type(std::string_view path, Kind kind, const toml::node& node) {
  return {fmt::format("'{}' must be {}, got {}", path, kind_name(kind), type_name(node))};
}

using StringCheck = std::function<std::optional<std::string>(const std::string&)>;

Key string_key(std::string_view path, std::string& (*field)(Config&), StringCheck check = {}) {
  return {path, Kind::string,
          [path, field, check](Config& c, const toml::node& node) -> std::optional<Rule> {
            const auto* s = node.as_string();
            if (s == nullptr) return wrong_type(path, Kind::string, node);
            if (check) {
              if (auto broken = check(s->get())) {
                return Rule{fmt::format("'{}' {}; got '{}'", path, *broken, s->get())};
              }
            }
            field(c) = s->get();
            return std::nullopt;
          }};
}

template <typename T>
Key integer_key(std::string_view path, T& (*field)(Config&), std::int64_t min,
                std::int64_t max = static_cast<std::int64_t>(
                    std::min<std::uint64_t>(std::numeric_limits<T>::max(),
                                            std::numeric_limits<std::int64_t>::max()))) {
  return {path, Kind::integer,
          [path, field, min, max](Config& c, const toml::node& node) -> std::optional<Rule> {
            const auto* i = node.as_integer();
            if (i == nullptr) return wrong_type(path, Kind::integer, node);
            const std::int64_t v = i->get();
            if (v < min || v > max) {
              return Rule{fmt::format("'{}' must be in [{}, {}], got {}", path, min, max, v)};
            }
            field(c) = static_cast<T>(v);
            return std::nullopt;
          }};
}

Key boolean_key(std::string_view path, bool& (*field)(Config&)) {
  return {path, Kind::boolean,
          [path, field](Config& c, const toml::node& node) -> std::optional<Rule> {
            const auto* b = node.as_boolean();
            if (b == nullptr) return wrong_type(path, Kind::boolean, node);
            field(c) = b->get();
            return std::nullopt;
          }};
}

Key string_array_key(std::string_view path, std::vector<std::string>& (*field)(Config&)) {
  return {path, Kind::string_array,
          [path, field](Config& c, const toml::node& node) -> std::optional<Rule> {
            const auto* array = node.as_array();
            if (array == nullptr) return wrong_type(path, Kind::string_array, node);
            std::vector<std::string> out;
            for (std::size_t i = 0; i < array->size(); ++i) {
              const auto* s = (*array)[i].as_string();
              if (s == nullptr) {
                return Rule{fmt::format("'{}[{}]' must be a string, got {}", path, i,
                                        type_name((*array)[i]))};
              }
              if (s->get().empty()) return Rule{fmt::format("'{}[{}]' is empty", path, i)};
              out.push_back(s->get());
            }
            field(c) = std::move(out);
            return std::nullopt;
          }};
}

// A string key with a fixed set of spellings mapped to an enum.
template <typename E, std::size_t N>
Key choice_key(std::string_view path, E& (*field)(Config&),
               std::array<std::pair<std::string_view, E>, N> choices) {
  std::vector<std::string_view> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  return {path, Kind::string,
          [path, field, choices](Config& c, const toml::node& node) -> std::optional<Rule> {
            const auto* s = node.as_string();
            if (s == nullptr) return wrong_type(path, Kind::string, node);
            std::string names;
            for (const auto& [name, value] : choices) {
              if (s->get() == name) {
                field(c) = value;
                return std::nullopt;
              }
              names += names.empty() ? "" : ", ";
              names += name;
            }
            return Rule{fmt::format("'{}' must be one of {}; got '{}'", path, names, s->get())};
          },
          std::move(names)};
}

std::optional<std::string> non_empty(const std::string& s) {
  if (s.empty()) return "must not be empty";
  return std::nullopt;
}

std::optional<std::string> device_name(const std::string& s) {
  if (s == "cpu" || s == "cuda") return std::nullopt;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 9 &&
      std::all_of(s.begin() + 5, s.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::nullopt;
  }
  return "must be 'cpu', 'cuda' or 'cuda:N'";
}

std::optional<std::string> log_level_name(const std::string& s) {
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
    if (s == level) return std::nullopt;
  }
  return "must be one of trace, debug, info, warn, error, off";
}

std::optional<std::string> absolute_or_empty(const std::string& s) {
  if (s.empty() || s.front() == '/') return std::nullopt;
  return "must be an absolute path (or empty)";
}

constexpr std::array<std::pair<std::string_view, ReleasePolicy>, 2> kPolicies = {{
    {"discard", ReleasePolicy::discard},
    {"backup", ReleasePolicy::backup},
}};
constexpr std::array<std::pair<std::string_view, Delivery>, 3> kDeliveries = {{
    {"auto", Delivery::automatic},
    {"direct", Delivery::direct},
    {"staged", Delivery::staged},
}};
constexpr std::array<std::pair<std::string_view, DirectVerify>, 2> kDirectVerifies = {{
    {"writer", DirectVerify::writer},
    {"reread", DirectVerify::reread},
}};
constexpr std::array<std::pair<std::string_view, MirrorRefresh>, 3> kMirrorRefreshes = {{
    {"background", MirrorRefresh::background},
    {"complete", MirrorRefresh::complete},
    {"commit", MirrorRefresh::commit},
}};
constexpr std::array<std::pair<std::string_view, Layout>, 2> kLayouts = {{
    {"engine", Layout::engine},
    {"hf", Layout::hf},
}};

constexpr std::int64_t kMaxThreads = 1024;
constexpr std::int64_t kMaxTimeoutMs = std::int64_t{7} * 24 * 3600 * 1000;  // a week

// Every known key. docs/config.md lists the same keys; tests/config checks each one.
const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      string_array_key("plugin_dirs", [](Config& c) -> auto& { return c.plugin_dirs; }),
      string_key("log_level", [](Config& c) -> auto& { return c.log_level; }, log_level_name),
      choice_key("progress", +[](Config& c) -> ProgressMode& { return c.progress; },
                 kProgressModes),
      integer_key<std::uint64_t>("progress_interval_ms",
                                 [](Config& c) -> auto& { return c.progress_interval_ms; }, 100,
                                 kMaxTimeoutMs),

      string_key("receiver.host", [](Config& c) -> auto& { return c.receiver.host; }, non_empty),
      integer_key<std::uint16_t>("receiver.port",
                                 [](Config& c) -> auto& { return c.receiver.port; }, 0),
      string_key("receiver.token", [](Config& c) -> auto& { return c.receiver.token; }),
      string_key("receiver.device", [](Config& c) -> auto& { return c.receiver.device; },
                 device_name),
      string_key("receiver.model_path", [](Config& c) -> auto& { return c.receiver.model_path; }),
      string_key("receiver.model_family",
                 [](Config& c) -> auto& { return c.receiver.model_family; }),
      choice_key("receiver.layout", +[](Config& c) -> Layout& { return c.receiver.layout; },
                 kLayouts),
      integer_key<std::uint32_t>("receiver.tp_rank",
                                 [](Config& c) -> auto& { return c.receiver.tp_rank; }, 0),
      integer_key<std::uint32_t>("receiver.tp_size",
                                 [](Config& c) -> auto& { return c.receiver.tp_size; }, 1),
      integer_key<std::uint32_t>("receiver.ep_rank",
                                 [](Config& c) -> auto& { return c.receiver.ep_rank; }, 0),
      integer_key<std::uint32_t>("receiver.ep_size",
                                 [](Config& c) -> auto& { return c.receiver.ep_size; }, 1),
      string_key("receiver.transport", [](Config& c) -> auto& { return c.receiver.transport; },
                 non_empty),
      string_array_key("receiver.model_family_hints",
                       [](Config& c) -> auto& { return c.receiver.model_family_hints; }),
      string_key("receiver.embedded_model_family",
                 [](Config& c) -> auto& { return c.receiver.embedded_model_family; }, non_empty),

      integer_key<std::uint64_t>("update.bucket_bytes",
                                 [](Config& c) -> auto& { return c.update.bucket_bytes; }, 1),
      integer_key<std::uint32_t>("update.read_threads",
                                 [](Config& c) -> auto& { return c.update.read_threads; }, 0,
                                 kMaxThreads),
      integer_key<std::uint32_t>("update.apply_threads",
                                 [](Config& c) -> auto& { return c.update.apply_threads; }, 0,
                                 kMaxThreads),
      boolean_key("update.verify_fingerprints",
                  [](Config& c) -> auto& { return c.update.verify_fingerprints; }),
      boolean_key("update.keep_sessions",
                  [](Config& c) -> auto& { return c.update.keep_sessions; }),
      boolean_key("update.rejoin_when_resumed",
                  [](Config& c) -> auto& { return c.update.rejoin_when_resumed; }),
      choice_key("update.delivery", +[](Config& c) -> Delivery& { return c.update.delivery; },
                 kDeliveries),
      choice_key("update.direct_verify",
                 +[](Config& c) -> DirectVerify& { return c.update.direct_verify; },
                 kDirectVerifies),
      integer_key<std::uint64_t>("update.bucket_timeout_ms",
                                 [](Config& c) -> auto& { return c.update.bucket_timeout_ms; }, 1,
                                 kMaxTimeoutMs),
      integer_key<std::uint64_t>("update.commit_timeout_ms",
                                 [](Config& c) -> auto& { return c.update.commit_timeout_ms; }, 1,
                                 kMaxTimeoutMs),
      integer_key<std::uint64_t>(
          "update.staged_tensors_timeout_ms",
          [](Config& c) -> auto& { return c.update.staged_tensors_timeout_ms; }, 1, kMaxTimeoutMs),
      string_key("update.transport", [](Config& c) -> auto& { return c.update.transport; },
                 non_empty),
      string_array_key("update.transport_preference",
                       [](Config& c) -> auto& { return c.update.transport_preference; }),
      string_key("update.group_transport",
                 [](Config& c) -> auto& { return c.update.group_transport; }, non_empty),
      string_key("update.gloo_transport",
                 [](Config& c) -> auto& { return c.update.gloo_transport; }, non_empty),
      string_key("update.ckpt_engine_transport",
                 [](Config& c) -> auto& { return c.update.ckpt_engine_transport; }, non_empty),

      choice_key("memory.weights_policy",
                 +[](Config& c) -> ReleasePolicy& { return c.memory.weights_policy; }, kPolicies),
      choice_key("memory.staging_policy",
                 +[](Config& c) -> ReleasePolicy& { return c.memory.staging_policy; }, kPolicies),
      string_key("memory.mirror_path", [](Config& c) -> auto& { return c.memory.mirror_path; },
                 absolute_or_empty),
      choice_key("memory.mirror_refresh",
                 +[](Config& c) -> MirrorRefresh& { return c.memory.mirror_refresh; },
                 kMirrorRefreshes),

      integer_key<std::uint32_t>("demo.steps", [](Config& c) -> auto& { return c.demo.steps; },
                                 1),
      integer_key<std::uint64_t>("demo.hidden_size",
                                 [](Config& c) -> auto& { return c.demo.hidden_size; }, 1),
      integer_key<std::uint32_t>("demo.layers", [](Config& c) -> auto& { return c.demo.layers; },
                                 1),
      integer_key<std::uint64_t>("demo.vocab_size",
                                 [](Config& c) -> auto& { return c.demo.vocab_size; }, 1),
      string_key("demo.transport", [](Config& c) -> auto& { return c.demo.transport; },
                 non_empty),
      string_key("demo.device", [](Config& c) -> auto& { return c.demo.device; }, device_name),
  };
  return table;
}

const Key* find_key(std::string_view path) {
  for (const Key& key : keys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

constexpr std::array<std::string_view, 4> kSections = {"receiver", "update", "memory", "demo"};

bool is_section(std::string_view name) {
  return std::find(kSections.begin(), kSections.end(), name) != kSections.end();
}

bool is_plugin_group(std::string_view name) { return name == "transport" || name == "model"; }

// "unknown key 'receiver.prot'; did you mean 'receiver.port'?": the nearest known key by
// spelling, else a key of the same name in another section ("receiver.bucket_bytes" ->
// "update.bucket_bytes"), else the keys of the section it is in (or is).
Rule unknown_key(std::string_view path) {
  const auto leaf = [](std::string_view p) { return p.substr(p.rfind('.') + 1); };
  const auto keys_of = [](std::string_view section) {
    std::string list;
    for (const Key& key : keys()) {
      if (key.path.size() > section.size() && key.path.substr(0, section.size()) == section &&
          key.path[section.size()] == '.') {
        list += (list.empty() ? "" : ", ") + std::string(key.path.substr(section.size() + 1));
      }
    }
    return list;
  };
  if (is_section(path)) {
    return Rule{fmt::format("unknown key '{}' ([{}] is a section; its keys: {})", path, path,
                            keys_of(path))};
  }
  std::vector<std::string> known;
  for (const Key& key : keys()) known.emplace_back(key.path);
  for (const auto section : kSections) known.emplace_back(section);
  known.emplace_back("transport");
  known.emplace_back("model");
  std::optional<std::string> near = nearest(path, known);
  for (std::size_t i = 0; !near && i < known.size(); ++i) {
    if (known[i].find('.') != std::string::npos && leaf(known[i]) == leaf(path)) near = known[i];
  }
  if (near) return Rule{fmt::format("unknown key '{}'; did you mean '{}'?", path, *near)};
  const auto dot = path.find('.');
  const std::string_view section = dot == std::string_view::npos ? "" : path.substr(0, dot);
  if (is_section(section)) {
    return Rule{fmt::format("unknown key '{}' (the keys of [{}]: {})", path, section,
                            keys_of(section))};
  }
  return Rule{fmt::format("unknown key '{}'", path)};
}

std::map<std::string, PluginOptions>& plugin_group(Config& c, std::string_view group) {
  return group == "transport" ? c.transports : c.models;
}

// Plugin names become file names (libferry_transport_<name>.so): keep them plain.
std::optional<Rule> check_plugin_name(std::string_view group, std::string_view name) {
  const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-';
  });
  if (plain) return std::nullopt;
  return Rule{fmt::format("'{}.{}': a plugin name must be letters, digits, '_' or '-'", group,
                          name)};
}

// A plugin option value as the string the plugin receives, or the broken rule.
std::optional<Rule> option_string(std::string_view path, const toml::node& node,
                                  std::string& out) {
  if (const auto* s = node.as_string()) {
    out = s->get();
  } else if (const auto* i = node.as_integer()) {
    out = std::to_string(i->get());
  } else if (const auto* f = node.as_floating_point()) {
    out = fmt::format("{}", f->get());
  } else if (const auto* b = node.as_boolean()) {
    out = b->get() ? "true" : "false";
  } else {
    return Rule{fmt::format("'{}' must be a string, number or boolean, got {}", path,
                            type_name(node))};
  }
  return std::nullopt;
}

// Where a node was written, for messages: "config.toml:12".
std::string where(const std::string& source, const toml::source_region& region) {
  if (region.begin.line == 0) return source;
  return fmt::format("{}:{}", source, region.begin.line);
}

[[noreturn]] void fail_at(const std::string& location, const Rule& rule) {
  fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {}", location, rule.message);
}

// The cross-key rules. `line_of` gives the location of a key as written, for the message.
void check_cross(const Config& c, const std::function<std::string(std::string_view)>& line_of) {
  if (c.receiver.tp_rank >= c.receiver.tp_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}'receiver.tp_rank' {} must be < 'receiver.tp_size' {}",
         line_of("receiver.tp_rank"), c.receiver.tp_rank, c.receiver.tp_size);
  }
  if (c.receiver.ep_rank >= c.receiver.ep_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}'receiver.ep_rank' {} must be < 'receiver.ep_size' {}",
         line_of("receiver.ep_rank"), c.receiver.ep_rank, c.receiver.ep_size);
  }
}

void parse_plugin_group(Config& c, std::string_view group, const toml::node& node,
                        const std::string& source) {
  const auto* table = node.as_table();
  if (table == nullptr) {
    fail_at(where(source, node.source()),
            Rule{fmt::format("'{}' must be a table of [{}.<name>] sections, got {}", group, group,
                             type_name(node))});
  }
  for (const auto& [name_key, section] : *table) {
    const std::string name(name_key.str());
    const std::string section_path = fmt::format("{}.{}", group, name);
    if (auto broken = check_plugin_name(group, name)) {
      fail_at(where(source, name_key.source()), *broken);
    }
    const auto* options = section.as_table();
    if (options == nullptr) {
      fail_at(where(source, section.source()),
              Rule{fmt::format("'{}' must be a table, got {}", section_path, type_name(section))});
    }
    PluginOptions& out = plugin_group(c, group)[name];
    c.origins[section_path] = where(source, name_key.source());
    for (const auto& [option_key, value] : *options) {
      const std::string path = fmt::format("{}.{}", section_path, option_key.str());
      std::string text;
      if (auto broken = option_string(path, value, text)) {
        fail_at(where(source, value.source()), *broken);
      }
      out[std::string(option_key.str())] = std::move(text);
      c.origins[path] = where(source, option_key.source());
    }
  }
}

std::optional<toml::table> parse_value_text(std::string_view value) {
  try {
    const std::string text = fmt::format("value = {}", value);
    toml::table table = toml::parse(std::string_view(text), std::string_view("--set"));
    // Exactly the one key: a value with a newline must not smuggle in more.
    if (table.size() != 1 || !table.contains("value")) return std::nullopt;
    return table;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Config parse(std::string_view toml_text, std::string source_name) {
  toml::table root;
  try {
    root = toml::parse(toml_text, std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {}", where(source_name, e.source()),
         e.description());
  }

  Config config;
  std::map<std::string, std::string, std::less<>> locations;  // key path -> "file:line"
  auto set = [&](const std::string& path, const toml::key& key, const toml::node& node) {
    const Key* known = find_key(path);
    const std::string location = where(source_name, key.source());
    if (known == nullptr) fail_at(location, unknown_key(path));
    if (auto broken = known->set(config, node)) fail_at(location, *broken);
    if (path == "log_level") config.log_level_given = true;
    locations[path] = location;
  };

  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    if (is_plugin_group(name)) {
      parse_plugin_group(config, name, node, source_name);
    } else if (is_section(name)) {
      const auto* section = node.as_table();
      if (section == nullptr) {
        fail_at(where(source_name, key.source()),
                Rule{fmt::format("'{}' must be a table, got {}", name, type_name(node))});
      }
      for (const auto& [sub_key, value] : *section) {
        set(fmt::format("{}.{}", name, sub_key.str()), sub_key, value);
      }
    } else {
      set(name, key, node);
    }
  }

  check_cross(config, [&](std::string_view path) {
    const auto it = locations.find(path);
    return it == locations.end() ? source_name + ": " : it->second + ": ";
  });
  return config;
}

Config load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    fail(err == ENOENT ? FERRY_STATUS_NOT_FOUND : FERRY_STATUS_IO,
         "config file '{}': cannot open: {}", path, std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(FERRY_STATUS_IO, "config file '{}': read failed", path);
  return parse(text.str(), path);
}

void apply_override(Config& config, std::string_view key_eq_value) {
  const std::string location = fmt::format("--set {}", key_eq_value);
  const auto eq = key_eq_value.find('=');
  if (eq == std::string_view::npos) {
    fail_at(location, Rule{"expected key.path=value"});
  }
  const std::string path(trim(key_eq_value.substr(0, eq)));
  const std::string_view value = trim(key_eq_value.substr(eq + 1));
  if (path.empty()) fail_at(location, Rule{"expected key.path=value"});

  // transport.<name>.<option> / model.<name>.<option>: free-form plugin options.
  const auto first_dot = path.find('.');
  if (first_dot != std::string::npos && is_plugin_group(path.substr(0, first_dot))) {
    const std::string group = path.substr(0, first_dot);
    const auto second_dot = path.find('.', first_dot + 1);
    if (second_dot == std::string::npos || second_dot + 1 == path.size()) {
      fail_at(location, Rule{fmt::format("unknown key '{}' (plugin options are {}.<name>.<key>)",
                                         path, group)});
    }
    const std::string name = path.substr(first_dot + 1, second_dot - first_dot - 1);
    if (auto broken = check_plugin_name(group, name)) fail_at(location, *broken);
    std::string text(value);
    // A valid TOML scalar is normalised like a file's value; anything else is taken as typed.
    if (const auto parsed = parse_value_text(value)) {
      if (option_string(path, *parsed->get("value"), text)) text = std::string(value);
    }
    plugin_group(config, group)[name][path.substr(second_dot + 1)] = std::move(text);
    config.origins[path] = location;
    config.origins.try_emplace(fmt::format("{}.{}", group, name), location);
    return;
  }

  const Key* key = find_key(path);
  if (key == nullptr) fail_at(location, unknown_key(path));

  std::optional<Rule> broken;
  const bool quoted = !value.empty() && (value.front() == '"' || value.front() == '\'');
  if (key->kind == Kind::string && !quoted) {
    // Bare text is the string itself: --set memory.weights_policy=discard.
    broken = key->set(config, toml::value<std::string>(std::string(value)));
  } else if (const auto parsed = parse_value_text(value)) {
    broken = key->set(config, *parsed->get("value"));
  } else if (key->kind == Kind::string) {
    broken = Rule{fmt::format("'{}' value {} is not a valid TOML string", path, value)};
  } else {
    // Not TOML: report it as the string it is ("must be an integer, got string").
    broken = key->set(config, toml::value<std::string>(std::string(value)));
  }
  if (broken) fail_at(location, *broken);
  if (path == "log_level") config.log_level_given = true;
}

void validate(const Config& config) {
  check_cross(config, [](std::string_view) { return std::string(); });
}

void apply_environment(Config& config) {
  const char* level = std::getenv("FERRY_LOG_LEVEL");
  if (level == nullptr || level[0] == '\0') return;
  const Key* key = find_key("log_level");
  if (auto broken = key->set(config, toml::value<std::string>(std::string(level)))) {
    fail_at("FERRY_LOG_LEVEL", *broken);
  }
  config.log_level_given = true;
}

Config load(const std::string& path, std::span<const std::string> overrides) {
  Config config = path.empty() ? Config{} : load_file(path);
  apply_environment(config);
  for (const std::string& override_text : overrides) apply_override(config, override_text);
  validate(config);
  return config;
}

std::vector<KeyInfo> known_keys() {
  std::vector<KeyInfo> out;
  for (const Key& key : keys()) {
    KeyInfo info{std::string(key.path), kind_name(key.kind), {}};
    for (const auto choice : key.choices) info.choices.emplace_back(choice);
    out.push_back(std::move(info));
  }
  return out;
}

const char* policy_name(ReleasePolicy policy) noexcept {
  for (const auto& [name, value] : kPolicies) {
    if (value == policy) return name.data();
  }
  return "?";
}

const char* mirror_refresh_name(MirrorRefresh refresh) noexcept {
  for (const auto& [name, value] : kMirrorRefreshes) {
    if (value == refresh) return name.data();
  }
  return "?";
}

const char* layout_name(Layout layout) noexcept {
  for (const auto& [name, value] : kLayouts) {
    if (value == layout) return name.data();
  }
  return "?";
}

std::vector<ferry_option_t> option_array(const PluginOptions& options) {
  std::vector<ferry_option_t> out;
  out.reserve(options.size());
  for (const auto& [key, value] : options) out.push_back({key.c_str(), value.c_str()});
  return out;
}

}  // namespace ferry::config
