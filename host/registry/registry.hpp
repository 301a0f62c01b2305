// registry/registry.hpp: finds, vets and loads plugins (Boost.DLL).
//
// Search order: config `plugin_dirs`, then FERRY_PLUGIN_PATH (colon-separated; ignored when the
// process runs with elevated privileges), then the install directory, then (development only) the
// in-tree build folders. File names: libferry_transport_<name>.so / libferry_model_<name>.so.
// Other files in a search folder are ignored. A candidate is refused, with a one-line reason, when
// it is not a loadable ELF, lacks the entry symbol, refuses the host or reports another ABI
// major / a too-old minor, reports a name or kind that differs from its file name, has a short or
// NULL function table, or is unsafe (world-writable file or folder, owned by another non-root
// user). The first accepted plugin of a (kind, name) wins; later ones are refused as shadowed
// (and never loaded). docs/plugin-abi.md is the reference for every rule.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry::registry {

// The oldest plugin ABI minor this host accepts (of major FERRY_PLUGIN_ABI_MAJOR).
inline constexpr std::uint32_t kMinPluginAbiMinor = 0;

struct PluginInfo {
  std::string name;
  ferry_plugin_kind_t kind = FERRY_PLUGIN_TRANSPORT;
  std::filesystem::path path;
  std::uint32_t abi_major = 0;
  std::uint32_t abi_minor = 0;
  std::string version;
  std::optional<ferry_transport_caps_t> transport_caps;  // transports only
  // The option keys its create accepts (plugin ABI 1.3, negotiation option_keys); nullopt when
  // the plugin did not declare them.
  std::optional<std::vector<std::string>> option_keys;
};

struct Refusal {
  std::filesystem::path path;
  std::string reason;  // one line, without the path
  // "<path>: <reason>"
  std::string describe() const;
};

// "transport" / "model".
const char* kind_name(ferry_plugin_kind_t kind) noexcept;

// A loaded, accepted plugin. Keeps the shared object mapped for as long as any copy lives.
class LoadedPlugin {
 public:
  virtual ~LoadedPlugin() = default;
  virtual const PluginInfo& info() const = 0;
  // Non-null exactly when info().kind matches. The table is the host's zero-filled copy of the
  // plugin's table: fields past the plugin's struct_size read as NULL, and struct_size is the
  // number of bytes that came from the plugin (at most sizeof the host's table).
  virtual const ferry_transport_api_t* transport() const = 0;
  virtual const ferry_model_api_t* model() const = 0;
};

class Registry {
 public:
  // Scans `search_dirs` in order (see default_search_path). Folders that do not exist are
  // skipped; a folder listed twice is scanned once. Never throws for a bad plugin: it lands in
  // refused().
  explicit Registry(std::vector<std::filesystem::path> search_dirs);

  // config dirs, then FERRY_PLUGIN_PATH, then the install directory, then `extra_last`.
  static std::vector<std::filesystem::path> default_search_path(
      const std::vector<std::filesystem::path>& config_dirs,
      const std::vector<std::filesystem::path>& extra_last = {});

  // Loads and vets one file (used by `ferry conformance` and tests); throws ferry::Error
  // (INCOMPATIBLE, or NOT_FOUND for a missing file) whose message is "<path>: <refusal reason>".
  // The expected kind and name come from the file name.
  static std::shared_ptr<LoadedPlugin> load_file(const std::filesystem::path& path);

  const std::vector<std::filesystem::path>& search_dirs() const;
  const std::vector<std::shared_ptr<LoadedPlugin>>& plugins() const;
  const std::vector<Refusal>& refused() const;

  // The accepted plugin of that kind and name; throws ferry::Error NOT_FOUND naming what was
  // searched, what is available, and the refusal reason if a file of that name was refused.
  std::shared_ptr<LoadedPlugin> transport(const std::string& name) const;
  std::shared_ptr<LoadedPlugin> model(const std::string& name) const;

 private:
  std::shared_ptr<LoadedPlugin> find(ferry_plugin_kind_t kind, const std::string& name) const;

  std::vector<std::filesystem::path> search_dirs_;
  std::vector<std::shared_ptr<LoadedPlugin>> plugins_;
  std::vector<Refusal> refused_;
};

// The plugin folders of an install that was moved or staged (meson install --destdir, a bundle):
// for the executable `exe` at <prefix>/bin/, <prefix>/<libdir>/ferry/plugins (libdir as
// configured, e.g. lib/x86_64-linux-gnu) and <prefix>/lib/ferry/plugins.
std::vector<std::filesystem::path> plugin_dirs_beside(const std::filesystem::path& exe);

// The pure part of default_search_path, for tests: `plugin_path_env` is FERRY_PLUGIN_PATH's value
// (nullopt: unset), `elevated` whether the process runs with elevated privileges (AT_SECURE), in
// which case the environment is ignored with a warning.
std::vector<std::filesystem::path> search_path(
    const std::vector<std::filesystem::path>& config_dirs,
    const std::optional<std::string>& plugin_path_env, bool elevated,
    const std::filesystem::path& install_dir, const std::vector<std::filesystem::path>& extra_last);

}  // namespace ferry::registry
