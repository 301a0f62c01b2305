// registry/loader.cpp: maps one plugin file, negotiates with it, and vets the answer (see
// loader.hpp). Nothing the plugin returns is dereferenced before it was copied safely.
#include "registry/loader.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "common/host_api.hpp"
#include "registry/safe_memory.hpp"

namespace ferry::registry {
namespace {

// Function fields of each table in declaration order (every field after struct_size is a function
// pointer); the first `required` of them are required.
constexpr std::array<const char*, 25> kTransportFunctions = {
    "get_caps",        "create",       "destroy",
    "get_address",     "connect",      "disconnect",
    "register_memory", "pack_key",     "deregister_memory",
    "send_bucket",     "recv_bucket",  "put",
    "flush",           "request_test", "request_wait",
    "request_free",    "abort",        "source_open",
    "source_catalog",  "source_read",  "source_close",
    "put_many",        "alloc_memory", "prepare_puts",
    "map_peer_memory"};
constexpr std::array<const char*, 7> kModelFunctions = {
    "create", "destroy", "target_layout", "layout_free", "plan", "plan_free", "locate"};

static_assert(sizeof(ferry_transport_api_t) ==
                  sizeof(std::size_t) + kTransportFunctions.size() * sizeof(void*),
              "kTransportFunctions must list every field of ferry_transport_api_t");
static_assert(sizeof(ferry_model_api_t) ==
                  sizeof(std::size_t) + kModelFunctions.size() * sizeof(void*),
              "kModelFunctions must list every field of ferry_model_api_t");

constexpr std::size_t kMaxNameLength = 255;

template <typename Table, std::size_t N>
std::optional<std::string> copy_table(const void* api, const std::array<const char*, N>& names,
                                      std::size_t required_size, Table* out,
                                      std::size_t* declared_size) {
  std::size_t declared = 0;
  if (!copy_readable(api, &declared, sizeof declared)) {
    return fmt::format("its function table pointer {} is not readable memory", api);
  }
  *declared_size = declared;
  if (declared < required_size) {
    return fmt::format(
        "its function table is {} bytes (struct_size), but the required functions need {} "
        "(short struct)",
        declared, required_size);
  }
  // Whole pointer fields only, and never more than this host's table holds.
  std::size_t take = std::min(declared, sizeof(Table));
  take -= take % sizeof(void*);
  std::memset(out, 0, sizeof(Table));
  if (!copy_readable(api, out, take)) {
    return fmt::format("its function table at {} is not readable for {} bytes", api, take);
  }
  out->struct_size = take;

  std::array<void*, N> functions{};
  std::memcpy(functions.data(), reinterpret_cast<const char*>(out) + sizeof(std::size_t),
              sizeof(functions));
  const std::size_t required_count = (required_size - sizeof(std::size_t)) / sizeof(void*);
  for (std::size_t i = 0; i < N; ++i) {
    if (functions[i] == nullptr) {
      if (i < required_count) return fmt::format("required function '{}' is NULL", names[i]);
      continue;
    }
    if (!inside_loaded_object(functions[i])) {
      return fmt::format("function '{}' points outside every loaded object ({})", names[i],
                         functions[i]);
    }
  }
  return std::nullopt;
}

// The dlerror text out of Boost.DLL's "... (dlerror system message: TEXT): <errno text>".
std::string dlerror_text(const std::string& what) {
  const std::string marker = "dlerror system message: ";
  const auto start = what.find(marker);
  if (start == std::string::npos) return what;
  const auto text_start = start + marker.size();
  const auto end = what.rfind(')');
  if (end == std::string::npos || end < text_start) return what.substr(text_start);
  return what.substr(text_start, end - text_start);
}

class Plugin final : public LoadedPlugin {
 public:
  Plugin(LibraryPtr library, PluginInfo info, const Tables& tables)
      : library_(std::move(library)), info_(std::move(info)), tables_(tables) {}

  const PluginInfo& info() const override { return info_; }
  const ferry_transport_api_t* transport() const override {
    return info_.kind == FERRY_PLUGIN_TRANSPORT ? &tables_.transport : nullptr;
  }
  const ferry_model_api_t* model() const override {
    return info_.kind == FERRY_PLUGIN_MODEL ? &tables_.model : nullptr;
  }

 private:
  LibraryPtr library_;  // first member: unmapped only after everything else is gone
  PluginInfo info_;
  Tables tables_;
};

}  // namespace

std::optional<OpenedLibrary> open_library(const std::filesystem::path& path, std::string* why) {
  OpenedLibrary opened;
  opened.library = std::make_shared<boost::dll::shared_library>();
  try {
    opened.library->load(boost::dll::fs::path(path.string()),
                         boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    *why = "not a loadable shared object: " + dlerror_text(e.what());
    return std::nullopt;
  }
  try {
    if (!opened.library->has(FERRY_PLUGIN_ENTRY_SYMBOL)) {
      *why = "does not export the entry symbol " FERRY_PLUGIN_ENTRY_SYMBOL
             " (not a ferry plugin, or built without FERRY_PLUGIN_EXPORT)";
      return std::nullopt;
    }
    opened.entry = &opened.library->get<ferry_error_t*(ferry_plugin_negotiation_t*)>(
        FERRY_PLUGIN_ENTRY_SYMBOL);
  } catch (const std::exception& e) {
    *why = std::string("cannot look up the entry symbol: ") + e.what();
    return std::nullopt;
  }
  return opened;
}

ferry_plugin_negotiation_t host_negotiation(const ferry_host_api_t* host) {
  ferry_plugin_negotiation_t n;
  std::memset(&n, 0, sizeof n);
  n.struct_size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, option_keys);
  n.host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
  n.host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
  n.host = host;
  return n;
}

std::optional<std::string> check_abi_version(const ferry_plugin_negotiation_t& answer,
                                             std::uint32_t min_minor) {
  if (answer.plugin_abi_major == 0) {
    return std::string("did not fill in its negotiation answer (plugin ABI major is 0)");
  }
  if (answer.plugin_abi_major != FERRY_PLUGIN_ABI_MAJOR) {
    return fmt::format(
        "implements plugin ABI {}.{}, but this host implements major {} (majors never mix)",
        answer.plugin_abi_major, answer.plugin_abi_minor, FERRY_PLUGIN_ABI_MAJOR);
  }
  if (answer.plugin_abi_minor < min_minor) {
    return fmt::format(
        "implements plugin ABI {}.{}, older than the oldest this host accepts ({}.{})",
        answer.plugin_abi_major, answer.plugin_abi_minor, FERRY_PLUGIN_ABI_MAJOR, min_minor);
  }
  return std::nullopt;
}

std::optional<std::string> check_identity(const ferry_plugin_negotiation_t& answer,
                                          const PluginFileName& expected, std::string* name,
                                          std::string* version) {
  const auto kind = static_cast<int>(answer.kind);
  if (kind != FERRY_PLUGIN_TRANSPORT && kind != FERRY_PLUGIN_MODEL) {
    return fmt::format("reports unknown plugin kind {}", kind);
  }
  if (answer.kind != expected.kind) {
    return fmt::format("reports kind {}, but its file name says {}", kind_name(answer.kind),
                       kind_name(expected.kind));
  }
  if (answer.name == nullptr) return std::string("did not report its name (name is NULL)");
  auto reported = read_c_string(answer.name, kMaxNameLength);
  if (!reported) {
    return fmt::format("its name pointer {} is not a readable string of at most {} bytes",
                       static_cast<const void*>(answer.name), kMaxNameLength);
  }
  if (*reported != expected.name) {
    return fmt::format("reports name '{}', but its file name says '{}'", *reported, expected.name);
  }
  *name = *reported;
  version->clear();
  if (answer.version != nullptr) {
    auto text = read_c_string(answer.version, kMaxNameLength);
    if (!text) {
      return fmt::format("its version pointer {} is not a readable string of at most {} bytes",
                         static_cast<const void*>(answer.version), kMaxNameLength);
    }
    *version = *text;
  }
  return std::nullopt;
}

std::optional<std::string> read_option_keys(const ferry_plugin_negotiation_t& answer,
                                            std::optional<std::vector<std::string>>* keys) {
  keys->reset();
  if (answer.option_keys == nullptr) return std::nullopt;  // not declared (ABI < 1.3, or left out)
  constexpr std::size_t kMaxOptionKeys = 256;
  std::vector<std::string> out;
  for (std::size_t i = 0;; ++i) {
    if (i == kMaxOptionKeys) {
      return fmt::format("its option_keys list has no NULL among its first {} entries",
                         kMaxOptionKeys);
    }
    const char* key = nullptr;
    if (!copy_readable(answer.option_keys + i, &key, sizeof key)) {
      return fmt::format("its option_keys entry {} at {} is not readable memory", i,
                         static_cast<const void*>(answer.option_keys + i));
    }
    if (key == nullptr) break;
    auto text = read_c_string(key, kMaxNameLength);
    if (!text || text->empty()) {
      return fmt::format("its option_keys entry {} is not a readable, non-empty string of at most "
                         "{} bytes",
                         i, kMaxNameLength);
    }
    out.push_back(std::move(*text));
  }
  *keys = std::move(out);
  return std::nullopt;
}

std::optional<std::string> copy_tables(const ferry_plugin_negotiation_t& answer,
                                       ferry_plugin_kind_t kind, Tables* out) {
  if (answer.api == nullptr) return std::string("returned a NULL function table (api)");
  if (kind == FERRY_PLUGIN_TRANSPORT) {
    return copy_table(answer.api, kTransportFunctions, kTransportRequiredSize, &out->transport,
                      &out->plugin_struct_size);
  }
  return copy_table(answer.api, kModelFunctions, kModelRequiredSize, &out->model,
                    &out->plugin_struct_size);
}

std::shared_ptr<LoadedPlugin> load_vetted(const std::filesystem::path& path,
                                          const PluginFileName& expected, std::string* why,
                                          const std::function<void(const char*)>& stage) {
  auto at = [&](const char* step) {
    if (stage) stage(step);
  };
  at("loading");
  auto opened = open_library(path, why);
  if (!opened) return nullptr;

  at(FERRY_PLUGIN_ENTRY_SYMBOL);
  ferry_plugin_negotiation_t answer = host_negotiation(host_api_table());
  if (ferry_error_t* refused = opened->entry(&answer)) {
    ErrorPtr owned(refused);
    *why = "refused the host: " + error_message(owned.get());
    return nullptr;
  }
  PluginInfo info;
  if (auto reason = check_abi_version(answer, kMinPluginAbiMinor)) {
    *why = *reason;
    return nullptr;
  }
  if (auto reason = check_identity(answer, expected, &info.name, &info.version)) {
    *why = *reason;
    return nullptr;
  }
  if (auto reason = read_option_keys(answer, &info.option_keys)) {
    *why = *reason;
    return nullptr;
  }
  Tables tables;
  if (auto reason = copy_tables(answer, expected.kind, &tables)) {
    *why = *reason;
    return nullptr;
  }
  info.kind = expected.kind;
  info.path = path;
  info.abi_major = answer.plugin_abi_major;
  info.abi_minor = answer.plugin_abi_minor;
  if (info.kind == FERRY_PLUGIN_TRANSPORT) {
    ferry_transport_caps_t caps;
    std::memset(&caps, 0, sizeof caps);
    caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    at("get_caps");
    if (ferry_error_t* failed = tables.transport.get_caps(&caps)) {
      ErrorPtr owned(failed);
      *why = fmt::format("get_caps failed: {} ({})", error_message(owned.get()),
                         status_name(error_code(owned.get())));
      return nullptr;
    }
    caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    info.transport_caps = caps;
  }
  return std::make_shared<Plugin>(std::move(opened->library), std::move(info), tables);
}

}  // namespace ferry::registry
