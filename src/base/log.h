// One logger for the library and the CLI.
//
// The level comes from FERRY_LOG_LEVEL (trace, debug, info, warn, error, off)
// and, when that is unset, from VERL_LOGGING_LEVEL (verl's names: DEBUG, INFO,
// WARNING, ERROR, CRITICAL), so a verl user's setting also reaches ferry.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
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

// A cap on how many lines of one kind a source writes per second, so that a peer that can
// make us refuse it cannot fill the disk with refusals. Each line that is let through after
// a suppressed run says how many were dropped. Not thread-safe: one per loop.
class Limiter {
 public:
  explicit Limiter(int lines_per_second = 5) : per_second_(lines_per_second) {}
  // Whether a line may be written at `now`; when it may and lines were dropped since the last
  // one, *dropped is their count (reset), else 0.
  bool allow(std::chrono::steady_clock::time_point now, std::uint64_t* dropped);

 private:
  int per_second_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  std::uint64_t dropped_ = 0;
};

// log::warn through `limiter`: "<message>", preceded by "(N similar lines suppressed)" after a
// suppressed run; nothing while the limit holds.
void warn_limited(Limiter& limiter, const std::string& message);

}  // namespace ferry::log
