#include "profiler/span.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <set>
#include <string>

#include "base/mutex.h"
#include "profiler/event.h"
#include "profiler/thread_buffer.h"

namespace ferry::profiler::detail {
namespace {

std::atomic<std::uint64_t> g_next_range_id{1};

// Fills the fields every event kind shares, from the flags in force now.
Event* begin_event(EventKind kind, const char* name, std::uint64_t start_ns, std::uint32_t flags,
                   const SourceLocation* where) {
  ThreadBuffer& buffer = this_thread_buffer();
  Event* e = buffer.reserve();
  if (e == nullptr) return nullptr;
  e->kind = kind;
  e->tid = buffer.tid();
  e->name = name;
  e->start_ns = start_ns;
  e->end_ns = start_ns;
  e->id = 0;
  e->value = 0;
  e->rss_begin_kb = 0;
  e->rss_end_kb = 0;
  e->args.clear();
  if ((flags & kStack) != 0 && where != nullptr) {
    e->file = where->file_name();
    e->function = where->function_name();
    e->line = where->line();
  } else {
    e->file = nullptr;
    e->function = nullptr;
    e->line = 0;
  }
  return e;
}

}  // namespace

std::uint64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// /proc/self/statm's second field (resident pages). One pread on a kept fd:
// about a microsecond, paid only when `memory` is on.
std::uint64_t rss_kb() {
  static const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  static const long page_kb = ::sysconf(_SC_PAGESIZE) / 1024;
  if (fd < 0) return 0;
  char buf[128];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  unsigned long long size = 0, resident = 0;
  if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
  return resident * static_cast<std::uint64_t>(page_kb);
}

void mark_impl(const char* name, const SourceLocation& where) {
  const std::uint32_t flags = g_flags.load(std::memory_order_relaxed);
  if (begin_event(EventKind::kMark, name, now_ns(), flags, &where) != nullptr) {
    this_thread_buffer().publish();
  }
}

Range range_start_impl(const char* name) {
  return Range{name, now_ns(), g_next_range_id.fetch_add(1, std::memory_order_relaxed)};
}

void range_end_impl(const Range& range) {
  const std::uint64_t end = now_ns();
  const std::uint32_t flags = g_flags.load(std::memory_order_relaxed);
  if ((flags & kOn) == 0) return;  // profiling stopped while the range was open
  Event* e = begin_event(EventKind::kRange, range.name, range.start_ns, flags, nullptr);
  if (e == nullptr) return;
  e->end_ns = end;
  e->id = range.id;
  this_thread_buffer().publish();
}

void counter_impl(const char* name, double value) {
  const std::uint32_t flags = g_flags.load(std::memory_order_relaxed);
  Event* e = begin_event(EventKind::kCounter, name, now_ns(), flags, nullptr);
  if (e == nullptr) return;
  e->value = value;
  this_thread_buffer().publish();
}

}  // namespace ferry::profiler::detail

namespace ferry::profiler {

void Span::begin(const char* name, Detail, SourceLocation where) {
  rec_.name = name;
  rec_.where = where;
  if ((flags_ & detail::kMemory) != 0) rec_.rss_begin_kb = detail::rss_kb();
  rec_.start_ns = detail::now_ns();
}

void Span::end() {
  const std::uint64_t end = detail::now_ns();
  Event* e = detail::begin_event(EventKind::kSpan, rec_.name, rec_.start_ns, flags_, &rec_.where);
  if (e != nullptr) {
    e->end_ns = end;
    if ((flags_ & detail::kMemory) != 0) {
      e->rss_begin_kb = rec_.rss_begin_kb;
      e->rss_end_kb = detail::rss_kb();
    }
    if (rec_.args != nullptr) e->args.swap(*rec_.args);
    this_thread_buffer().publish();
  }
  delete rec_.args;
  rec_.args = nullptr;
}

namespace {
nlohmann::json& args_of(detail::SpanRecord& rec) {
  if (rec.args == nullptr) rec.args = new nlohmann::json(nlohmann::json::object());
  return *rec.args;
}
}  // namespace

void Span::add_int(std::string_view key, std::int64_t value) {
  args_of(rec_)[std::string(key)] = value;
}

void Span::add_string(std::string_view key, std::string_view value) {
  args_of(rec_)[std::string(key)] = std::string(value);
}

void Span::add_shape(std::string_view tensor, std::string_view dtype,
                     std::span<const std::int64_t> dims) {
  std::string text(dtype);
  text.push_back('[');
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text.push_back(',');
    text += std::to_string(dims[i]);
  }
  text.push_back(']');
  add_string(tensor, text);
}

const char* intern(std::string_view name) {
  struct Interned {
    Mutex mu;
    // Node-based: the pointers handed out stay valid.
    std::set<std::string, std::less<>> names FERRY_GUARDED_BY(mu);
  };
  static Interned interned;
  MutexLock lock(interned.mu);
  auto it = interned.names.find(name);
  if (it == interned.names.end()) it = interned.names.emplace(name).first;
  return it->c_str();
}

}  // namespace ferry::profiler
