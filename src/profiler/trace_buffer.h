// The events of one trace, serialized as they arrive, under a byte budget: past it the
// oldest events go first and are counted, so the file can say what it lost. Every part is
// written by nlohmann::json: text that is not UTF-8 (a name, an argument) becomes U+FFFD, so
// the file is always valid JSON.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "profiler/event.h"

namespace ferry::profiler {

struct TraceHeader {
  int rank = 0;
  std::string role;
  std::int64_t step = -1;
  std::string task;  // empty for a per-step trace
  std::string host;
  int pid = 0;
  std::int64_t wall_minus_monotonic_ns = 0;  // aligns files across nodes
  bool module_category = false;              // `module`: category from the name's prefix
};

class TraceBuffer {
 public:
  explicit TraceBuffer(std::uint64_t budget_bytes) : budget_(budget_bytes) {}

  // Serializes `events` (sorted here by start) and drops the oldest past the budget.
  void add(std::vector<Event>* events, int pid, bool module_category);
  // Events lost upstream (full thread rings) also count as dropped.
  void add_overflow(std::uint64_t n) { overflow_dropped_ += n; }

  bool empty() const { return lines_.empty() && budget_dropped_ == 0 && overflow_dropped_ == 0; }
  std::uint64_t dropped() const { return budget_dropped_ + overflow_dropped_; }

  // The whole Chrome Trace Event JSON document; then the buffer is empty again.
  std::string take_json(const TraceHeader& header);

 private:
  // Room kept for the header, metadata and the drop note.
  static constexpr std::uint64_t kReserveBytes = 2048;
  std::uint64_t budget_;
  struct Line {
    double ts_us;  // the line's "ts", for the truncation marker
    std::string json;
  };
  std::deque<Line> lines_;
  std::uint64_t bytes_ = 0;
  std::uint64_t budget_dropped_ = 0;
  std::uint64_t overflow_dropped_ = 0;
};

// One event as Chrome trace JSON objects (a span with `memory` also yields counters).
std::vector<nlohmann::json> event_json(const Event& e, int pid, bool module_category);

// `value` as one line of JSON text; invalid UTF-8 in its strings becomes U+FFFD.
std::string dump_json(const nlohmann::json& value);

}  // namespace ferry::profiler
