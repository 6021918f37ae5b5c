// One logger for the library and the CLI.
//
// The level comes from FERRY_LOG_LEVEL (trace, debug, info, warn, error, off)
// and, when that is unset, from VERL_LOGGING_LEVEL (verl's names: DEBUG, INFO,
// WARNING, ERROR, CRITICAL), so a verl user's setting also reaches ferry.
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace ferry::log {

// The process-wide logger ("ferry"), writing to stderr; created on first use.
spdlog::logger& get();

// Parses a level name of either vocabulary; false if unknown.
bool parse_level(std::string_view text, spdlog::level::level_enum* out);

// Reapplies FERRY_LOG_LEVEL / VERL_LOGGING_LEVEL (for tests that change them).
void reload_level_from_env();

template <typename... Args>
void trace(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  get().trace(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  get().debug(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  get().info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  get().warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  get().error(fmt, std::forward<Args>(args)...);
}

}  // namespace ferry::log
