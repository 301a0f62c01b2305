// registry/loader.hpp: mapping one plugin file and vetting its negotiation answer. Shared by the
// registry (which refuses on the first problem) and the conformance suite (which reports each
// requirement separately), so both apply exactly the same rules.
#pragma once

#include <ferry/plugin.h>

#include <boost/dll/shared_library.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "registry/plugin_file.hpp"
#include "registry/registry.hpp"

namespace ferry::registry {

using LibraryPtr = std::shared_ptr<boost::dll::shared_library>;

// A mapped plugin file and its entry point.
struct OpenedLibrary {
  LibraryPtr library;
  ferry_plugin_negotiate_fn entry = nullptr;
};

// Maps `path` (RTLD_NOW | RTLD_LOCAL) and finds ferry_plugin_negotiate. nullopt with `*why` set
// ("not a loadable shared object: <dlerror>", "does not export the entry symbol ...") otherwise.
std::optional<OpenedLibrary> open_library(const std::filesystem::path& path, std::string* why);

// A negotiation struct as the host fills it: struct_size to the last field this host knows,
// the host's ABI version, `host` (the table plugins call back into), answer fields zeroed.
ferry_plugin_negotiation_t host_negotiation(const ferry_host_api_t* host);

// Each check returns the refusal reason, or nullopt when the answer passes it.
// The plugin's ABI version: major equal to the host's, minor at least kMinPluginAbiMinor.
std::optional<std::string> check_abi_version(const ferry_plugin_negotiation_t& answer,
                                             std::uint32_t min_minor = kMinPluginAbiMinor);
// Kind and name equal what the file name declares; sets *name / *version (read safely).
std::optional<std::string> check_identity(const ferry_plugin_negotiation_t& answer,
                                          const PluginFileName& expected, std::string* name,
                                          std::string* version);
// The declared option keys (ABI 1.3; NULL: *keys = nullopt), each entry read safely: at most
// 256, each a non-empty string of at most 255 bytes.
std::optional<std::string> read_option_keys(const ferry_plugin_negotiation_t& answer,
                                            std::optional<std::vector<std::string>>* keys);

// The function tables, copied out of the plugin (see LoadedPlugin::transport()).
struct Tables {
  ferry_transport_api_t transport{};
  ferry_model_api_t model{};
  std::size_t plugin_struct_size = 0;  // what the plugin's table declared
};
// Copies the table `answer.api` points at for `kind` and checks its struct_size covers every
// required function, the required functions are non-NULL, and every non-NULL function points
// into a loaded object.
std::optional<std::string> copy_tables(const ferry_plugin_negotiation_t& answer,
                                       ferry_plugin_kind_t kind, Tables* out);

// Bytes up to the end of the last required function of each table.
inline constexpr std::size_t kTransportRequiredSize =
    FERRY_STRUCT_SIZE(ferry_transport_api_t, destroy);
inline constexpr std::size_t kModelRequiredSize = FERRY_STRUCT_SIZE(ferry_model_api_t, plan_free);

// Runs the whole load for one file whose name was already parsed and whose safety was checked:
// map, negotiate with the host's table, vet, and (transports) query caps. nullptr with `*why`.
// `stage`, when set, is called before each step that runs plugin code ("loading" runs its
// constructors, then "ferry_plugin_negotiate", then "get_caps"): the vetting child reports it.
std::shared_ptr<LoadedPlugin> load_vetted(const std::filesystem::path& path,
                                          const PluginFileName& expected, std::string* why,
                                          const std::function<void(const char*)>& stage = {});

}  // namespace ferry::registry
