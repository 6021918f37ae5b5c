#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

namespace ferry::log {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = spdlog::stderr_color_mt("ferry");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [ferry] [%^%l%$] %v");
  return logger;
}

}  // namespace

bool parse_level(std::string_view text, spdlog::level::level_enum* out) {
  const std::string t = lower(text);
  using L = spdlog::level::level_enum;
  struct Name {
    const char* name;
    L level;
  };
  static constexpr Name kNames[] = {
      {"trace", L::trace},  {"debug", L::debug},  {"info", L::info},         {"warn", L::warn},
      {"warning", L::warn}, {"error", L::err},    {"critical", L::critical}, {"fatal", L::critical},
      {"off", L::off},      {"notset", L::trace},
  };
  for (const Name& n : kNames) {
    if (t == n.name) {
      *out = n.level;
      return true;
    }
  }
  return false;
}

// Reads the level from the environment; takes the logger so get() can call it
// while its own static is being initialised.
static void apply_env_level(spdlog::logger& logger) {
  spdlog::level::level_enum level = spdlog::level::info;
  const char* ferry_level = std::getenv("FERRY_LOG_LEVEL");
  const char* verl_level = std::getenv("VERL_LOGGING_LEVEL");
  const char* chosen = ferry_level && *ferry_level ? ferry_level : verl_level;
  if (chosen && *chosen && !parse_level(chosen, &level)) {
    logger.warn("ignoring unknown log level '{}' (expected trace, debug, info, warn, error, off)",
                chosen);
    level = spdlog::level::info;
  }
  logger.set_level(level);
}

void reload_level_from_env() { apply_env_level(get()); }

spdlog::logger& get() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = make_logger();
    apply_env_level(*l);
    return l;
  }();
  return *logger;
}

bool Limiter::allow(std::chrono::steady_clock::time_point now, std::uint64_t* dropped) {
  *dropped = 0;
  if (now - window_start_ >= std::chrono::seconds(1)) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++dropped_;
    return false;
  }
  ++in_window_;
  *dropped = dropped_;
  dropped_ = 0;
  return true;
}

void warn_limited(Limiter& limiter, const std::string& message) {
  std::uint64_t dropped = 0;
  if (!limiter.allow(std::chrono::steady_clock::now(), &dropped)) return;
  if (dropped > 0) {
    get().warn("{} ({} similar lines suppressed before this one)", message, dropped);
  } else {
    get().warn("{}", message);
  }
}

}  // namespace ferry::log
