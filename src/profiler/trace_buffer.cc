#include "profiler/trace_buffer.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "profiler/json_text.h"

namespace ferry::profiler {
namespace {

// Chrome traces count microseconds; keep nanosecond precision as decimals.
void append_us(std::string* out, std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%" PRIu64 ".%03" PRIu64, ns / 1000, ns % 1000);
  *out += buf;
}

std::string category(const char* name, bool module_category) {
  if (!module_category) return "ferry";
  std::string_view n(name);
  const std::size_t dot = n.find('.');
  return std::string(dot == std::string_view::npos ? n : n.substr(0, dot));
}

std::string common(const char* ph, const Event& e, std::uint64_t ts_ns, int pid,
                   const std::string& cat) {
  std::string s = "{\"name\":";
  append_json_string(&s, e.name);
  s += ",\"cat\":";
  append_json_string(&s, cat);
  s += ",\"ph\":\"";
  s += ph;
  s += "\",\"ts\":";
  append_us(&s, ts_ns);
  s += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(e.tid);
  return s;
}

void append_args(std::string* s, const Event& e) {
  std::string args = e.args;
  if (e.file != nullptr) {
    if (!args.empty()) args += ",";
    args += "\"site\":";
    append_json_string(&args, std::string(e.file) + ":" + std::to_string(e.line));
    args += ",\"function\":";
    append_json_string(&args, e.function != nullptr ? e.function : "");
  }
  if (e.rss_end_kb != 0) {
    if (!args.empty()) args += ",";
    args += "\"rss_begin_kb\":" + std::to_string(e.rss_begin_kb) +
            ",\"rss_end_kb\":" + std::to_string(e.rss_end_kb);
  }
  if (!args.empty()) *s += ",\"args\":{" + args + "}";
}

void rss_counter(const Event& e, std::uint64_t ts_ns, std::uint64_t kb, int pid,
                 std::vector<std::string>* out) {
  std::string s = "{\"name\":\"rss_kb\",\"ph\":\"C\",\"ts\":";
  append_us(&s, ts_ns);
  s += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(e.tid) +
       ",\"args\":{\"rss_kb\":" + std::to_string(kb) + "}}";
  out->push_back(std::move(s));
}

}  // namespace

void serialize_event(const Event& e, int pid, bool module_category, std::vector<std::string>* out) {
  const std::string cat = category(e.name, module_category);
  switch (e.kind) {
    case EventKind::kSpan: {
      std::string s = common("X", e, e.start_ns, pid, cat);
      s += ",\"dur\":";
      append_us(&s, e.end_ns - e.start_ns);
      append_args(&s, e);
      out->push_back(s + "}");
      if (e.rss_end_kb != 0) {
        rss_counter(e, e.start_ns, e.rss_begin_kb, pid, out);
        rss_counter(e, e.end_ns, e.rss_end_kb, pid, out);
      }
      break;
    }
    case EventKind::kRange: {
      // Async events: a range may cross threads and need not nest.
      const std::string id = ",\"id\":\"0x" + std::to_string(e.id) + "\"";
      out->push_back(common("b", e, e.start_ns, pid, cat) + id + "}");
      out->push_back(common("e", e, e.end_ns, pid, cat) + id + "}");
      break;
    }
    case EventKind::kMark: {
      std::string s = common("i", e, e.start_ns, pid, cat) + ",\"s\":\"t\"";
      append_args(&s, e);
      out->push_back(s + "}");
      break;
    }
    case EventKind::kCounter: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", e.value);
      out->push_back(common("C", e, e.start_ns, pid, cat) + ",\"args\":{\"value\":" + buf + "}}");
      break;
    }
  }
}

void TraceBuffer::add(std::vector<Event>* events, int pid, bool module_category) {
  std::stable_sort(events->begin(), events->end(),
                   [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
  std::vector<std::string> lines;
  for (const Event& e : *events) {
    lines.clear();
    serialize_event(e, pid, module_category, &lines);
    for (std::string& l : lines) {
      bytes_ += l.size() + 2;  // ",\n"
      lines_.push_back(std::move(l));
    }
  }
  events->clear();
  const std::uint64_t limit = budget_ > kReserveBytes ? budget_ - kReserveBytes : 0;
  while (bytes_ > limit && !lines_.empty()) {
    bytes_ -= lines_.front().size() + 2;
    lines_.pop_front();
    ++budget_dropped_;
  }
}

std::string TraceBuffer::take_json(const TraceHeader& h) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ferry\":{\"format\":1";
  out += ",\"rank\":" + std::to_string(h.rank) + ",\"role\":";
  append_json_string(&out, h.role);
  out += ",\"step\":" + std::to_string(h.step) + ",\"task\":";
  append_json_string(&out, h.task);
  out += ",\"host\":";
  append_json_string(&out, h.host);
  out += ",\"pid\":" + std::to_string(h.pid) +
         ",\"wall_minus_monotonic_ns\":" + std::to_string(h.wall_minus_monotonic_ns) +
         ",\"dropped_events\":" + std::to_string(dropped());
  if (dropped() > 0) {
    out += ",\"note\":";
    append_json_string(&out, "trace truncated: " + std::to_string(budget_dropped_) +
                                 " oldest events dropped to stay under the byte budget of " +
                                 std::to_string(budget_) + " bytes, " +
                                 std::to_string(overflow_dropped_) +
                                 " lost to full thread buffers");
  }
  out += "}},\n\"traceEvents\":[\n";
  std::string name = "ferry " + h.role + " rank" + std::to_string(h.rank);
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(h.pid) +
         ",\"tid\":0,\"args\":{\"name\":";
  append_json_string(&out, name);
  out += "}}";
  if (dropped() > 0) {
    // Also an event, so the viewer shows it where the kept part begins.
    out += ",\n{\"name\":\"ferry.trace_truncated\",\"ph\":\"i\",\"s\":\"g\",\"ts\":";
    std::string first = lines_.empty() ? std::string() : lines_.front();
    const std::size_t ts = first.find("\"ts\":");
    out += ts == std::string::npos ? "0" : first.substr(ts + 5, first.find(',', ts) - ts - 5);
    out += ",\"pid\":" + std::to_string(h.pid) +
           ",\"tid\":0,\"args\":{\"dropped_events\":" + std::to_string(dropped()) + "}}";
  }
  for (const std::string& l : lines_) {
    out += ",\n";
    out += l;
  }
  out += "\n]}\n";
  lines_.clear();
  bytes_ = 0;
  budget_dropped_ = 0;
  overflow_dropped_ = 0;
  return out;
}

}  // namespace ferry::profiler
