// capi/config_source.hpp: the configuration and plugin registry behind each C API handle: a
// ferry_config_source_t read into a validated config::Config, and the plugin search path of
// libferry.so (config dirs, FERRY_PLUGIN_PATH, install dir, beside the library, build tree).
#pragma once

#include <ferry/ferry.h>

#include <memory>

#include "config/config.hpp"
#include "registry/registry.hpp"

namespace ferry::capi {

// Defaults, then the file or the text, then the overrides, then validate(). `source` NULL means
// the defaults. Throws ferry::Error (INVALID_ARGUMENT, NOT_FOUND, IO) naming `function`.
config::Config load_config(const ferry_config_source_t* source, const char* function);

// A registry scanned in libferry's search order for `config`.
std::unique_ptr<registry::Registry> make_registry(const config::Config& config);

}  // namespace ferry::capi
