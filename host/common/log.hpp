// common/log.hpp: named spdlog loggers, one per component ("registry", "store", "update", ...).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace ferry {

// The logger for `component`, created on first use (stderr, shared level). Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& component);

// Sets the level of every ferry logger ("trace".."off"); unknown names throw ferry::Error.
void set_log_level(const std::string& level);

}  // namespace ferry
