// The low-level span API that engine code calls: RAII scopes, mstx-like marks
// and ranges, counters. Each event goes into the calling thread's own lock-free
// ring (allocated on the thread's first event); recording takes no lock, and
// allocates only for span arguments.
//
//   ferry::profiler::Span span("sync.pack");              // stage span (always on when enabled)
//   ferry::profiler::Span b("sync.bucket", Detail::kBucket);  // only at level1 and above
//   b.arg("bucket", index);
//   b.shape(spec.name, "BF16", spec.shape);               // only with `shapes` in contents
//   auto r = ferry::profiler::range_start("sync.wait_release");  // may end on another thread
//   ferry::profiler::range_end(r);
//   ferry::profiler::mark("sync.round_aborted");
//
// Names must be string literals (or intern()ed): only the pointer is stored.
// When profiling is off a span costs one relaxed atomic load and a branch
// (bench/profiler_bench.cc: docs/benchmarks.md has the figures).
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>

namespace ferry::profiler {

// How fine a span is; the config's level decides which are kept.
// level_none and level0 keep kStage, level1 adds kBucket, level2 adds kTensor.
enum class Detail : std::uint8_t { kStage = 0, kBucket = 1, kTensor = 2 };

// What range_start returns; pass it to range_end.
struct Range {
  const char* name = nullptr;  // null when profiling was off at range_start
  std::uint64_t start_ns = 0;
  std::uint64_t id = 0;
};

// The call site of a span. Not SourceLocation: clang 14 (the fuzz and sanitizer
// compiler here) lacks the builtin libstdc++ 12 needs for it, while these builtins work
// on GCC and clang alike.
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE(),
                                          const char* function = __builtin_FUNCTION()) {
    return SourceLocation(file, line, function);
  }
  constexpr SourceLocation() = default;
  constexpr const char* file_name() const { return file_; }
  constexpr int line() const { return line_; }
  constexpr const char* function_name() const { return function_; }

 private:
  constexpr SourceLocation(const char* file, int line, const char* function)
      : file_(file), line_(line), function_(function) {}
  const char* file_ = "";
  int line_ = 0;
  const char* function_ = "";
};

namespace detail {

// One word holds everything a span checks, so the check is a single load.
inline constexpr std::uint32_t kOn = 1u << 0;
inline constexpr std::uint32_t kMemory = 1u << 1;
inline constexpr std::uint32_t kShapes = 1u << 2;
inline constexpr std::uint32_t kStack = 1u << 3;
inline constexpr std::uint32_t kModule = 1u << 4;
inline constexpr int kDetailShift = 8;  // bits 8..9: the highest Detail kept

inline std::atomic<std::uint32_t> g_flags{0};

inline bool keeps(std::uint32_t flags, Detail d) {
  return (flags & kOn) != 0 && static_cast<std::uint32_t>(d) <= ((flags >> kDetailShift) & 3u);
}

std::uint64_t now_ns();  // CLOCK_MONOTONIC: shared by every process of a node

// What a live Span holds; the args string is allocated only if an argument is added.
struct SpanRecord {
  const char* name = nullptr;
  std::uint64_t start_ns = 0;
  std::uint64_t rss_begin_kb = 0;
  SourceLocation where;
  nlohmann::json* args = nullptr;  // a JSON object of the span's arguments
};

void mark_impl(const char* name, const SourceLocation& where);
Range range_start_impl(const char* name);
void range_end_impl(const Range& range);
void counter_impl(const char* name, double value);

}  // namespace detail

// True when profiling is on (one relaxed load); use it to skip building arguments.
inline bool enabled() {
  return (detail::g_flags.load(std::memory_order_relaxed) & detail::kOn) != 0;
}

// A timed scope, recorded when it ends. Not copyable or movable: it belongs to its scope
// and its thread.
class Span {
 public:
  explicit Span(const char* name, Detail d = Detail::kStage,
                SourceLocation where = SourceLocation::current())
      : flags_(detail::g_flags.load(std::memory_order_relaxed)) {
    if (detail::keeps(flags_, d)) [[unlikely]] {
      begin(name, d, where);
    } else {
      flags_ = 0;
    }
  }
  ~Span() {
    if (flags_ != 0) [[unlikely]] {
      end();
    }
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const { return flags_ != 0; }
  bool wants_shapes() const { return (flags_ & detail::kShapes) != 0; }

  // Arguments shown in the viewer; ignored when the span is inactive.
  void arg(std::string_view key, std::int64_t value) {
    if (active()) add_int(key, value);
  }
  void arg(std::string_view key, std::string_view value) {
    if (active()) add_string(key, value);
  }
  // Kept only when `shapes` is in contents: {"<tensor>": "BF16[151936,4096]"}.
  void shape(std::string_view tensor, std::string_view dtype, std::span<const std::int64_t> dims) {
    if (wants_shapes()) add_shape(tensor, dtype, dims);
  }

 private:
  void begin(const char* name, Detail d, SourceLocation where);
  void end();
  void add_int(std::string_view key, std::int64_t value);
  void add_string(std::string_view key, std::string_view value);
  void add_shape(std::string_view tensor, std::string_view dtype,
                 std::span<const std::int64_t> dims);

  std::uint32_t flags_;
  detail::SpanRecord rec_;
};

// An instant event (mstx mark).
inline void mark(const char* name, SourceLocation where = SourceLocation::current()) {
  if (enabled()) [[unlikely]] {
    detail::mark_impl(name, where);
  }
}
// mstx-like ranges: a range may end on another thread than the one that started it.
// A range never ended is not recorded.
inline Range range_start(const char* name, Detail d = Detail::kStage) {
  if (detail::keeps(detail::g_flags.load(std::memory_order_relaxed), d)) [[unlikely]] {
    return detail::range_start_impl(name);
  }
  return {};
}
inline void range_end(const Range& range) {
  if (range.name != nullptr) [[unlikely]] {
    detail::range_end_impl(range);
  }
}
// A counter track value (bytes in flight, free slots, ...).
inline void counter(const char* name, double value) {
  if (enabled()) [[unlikely]] {
    detail::counter_impl(name, value);
  }
}

// Returns a pointer with program lifetime for a name built at run time.
// Thread-safe; takes a lock, so call it once, not per event.
const char* intern(std::string_view name);

}  // namespace ferry::profiler
