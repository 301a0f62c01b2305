// registry/registry.hpp: finds, vets and loads plugins (Boost.DLL).
//
// Search order: config `plugin_dirs`, then FERRY_PLUGIN_PATH (colon-separated; ignored when the
// process runs with elevated privileges), then the install directory, then (development only) the
// in-tree build folders. File names: libferry_transport_<name>.so / libferry_model_<name>.so.
// A candidate is refused, with a one-line reason naming the file, when it is not a loadable ELF,
// lacks the entry symbol, refuses the host or reports another ABI major / a too-old minor, reports
// a name or kind that differs from its file name, has a short or NULL function table, or is unsafe
// (world-writable file or folder, owned by another non-root user). The first accepted plugin of a
// (kind, name) wins; later ones are refused as shadowed.
#pragma once

#include <ferry/plugin.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry::registry {

struct PluginInfo {
  std::string name;
  ferry_plugin_kind_t kind = FERRY_PLUGIN_TRANSPORT;
  std::filesystem::path path;
  std::uint32_t abi_major = 0;
  std::uint32_t abi_minor = 0;
  std::string version;
  std::optional<ferry_transport_caps_t> transport_caps;  // transports only
};

struct Refusal {
  std::filesystem::path path;
  std::string reason;  // one line
};

// A loaded, accepted plugin. Keeps the shared object mapped for as long as any copy lives.
class LoadedPlugin {
 public:
  virtual ~LoadedPlugin() = default;
  virtual const PluginInfo& info() const = 0;
  // Non-null exactly when info().kind matches.
  virtual const ferry_transport_api_t* transport() const = 0;
  virtual const ferry_model_api_t* model() const = 0;
};

class Registry {
 public:
  // Scans `search_dirs` in order (see default_search_path).
  explicit Registry(std::vector<std::filesystem::path> search_dirs);

  // config dirs, then FERRY_PLUGIN_PATH, then the install directory, then `extra_last`.
  static std::vector<std::filesystem::path> default_search_path(
      const std::vector<std::filesystem::path>& config_dirs,
      const std::vector<std::filesystem::path>& extra_last = {});

  // Loads and vets one file (used by `ferry conformance`); throws ferry::Error with the refusal
  // reason. `expected_name` empty: derive it from the file name.
  static std::shared_ptr<LoadedPlugin> load_file(const std::filesystem::path& path);

  const std::vector<std::filesystem::path>& search_dirs() const;
  const std::vector<std::shared_ptr<LoadedPlugin>>& plugins() const;
  const std::vector<Refusal>& refused() const;

  // The accepted plugin of that kind and name; throws ferry::Error NOT_FOUND naming what was
  // searched, what is available, and the refusal reason if a file of that name was refused.
  std::shared_ptr<LoadedPlugin> transport(const std::string& name) const;
  std::shared_ptr<LoadedPlugin> model(const std::string& name) const;

 private:
  std::vector<std::filesystem::path> search_dirs_;
  std::vector<std::shared_ptr<LoadedPlugin>> plugins_;
  std::vector<Refusal> refused_;
};

}  // namespace ferry::registry
