// One recorded event as it sits in a thread buffer and in a trace before it is written.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace ferry::profiler {

enum class EventKind : std::uint8_t {
  kSpan,     // a Span scope: "X" on its thread
  kRange,    // range_start/range_end: an async "b"/"e" pair
  kMark,     // an instant "i"
  kCounter,  // a "C" value
};

struct Event {
  EventKind kind = EventKind::kSpan;
  std::uint32_t tid = 0;
  const char* name = "";
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;        // == start_ns for marks and counters
  std::uint64_t id = 0;            // ranges only
  double value = 0;                // counters only
  std::uint64_t rss_begin_kb = 0;  // 0 unless `memory` is on
  std::uint64_t rss_end_kb = 0;
  const char* file = nullptr;  // call site, when `stack` is on
  const char* function = nullptr;
  std::uint32_t line = 0;
  nlohmann::json args;  // the span's arguments: an object, or null when there are none
};

}  // namespace ferry::profiler
