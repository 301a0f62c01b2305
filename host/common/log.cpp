// Named component loggers over spdlog (see common/log.hpp).
#include "common/log.hpp"

#include <ferry/sdk/error.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace ferry {
namespace {
std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::info;
}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  std::lock_guard lock(g_mutex);
  auto existing = spdlog::get(component);
  if (existing) return existing;
  auto created = spdlog::stderr_color_mt(component);
  created->set_level(g_level);
  created->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return created;
}

void set_log_level(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "unknown log level '{}' (trace, debug, info, warn, error, off)", level);
  }
  std::lock_guard lock(g_mutex);
  g_level = parsed;
  spdlog::set_level(parsed);
}

}  // namespace ferry
