#include "profiler/trace_buffer.h"

#include <algorithm>

namespace ferry::profiler {
namespace {

using Json = nlohmann::json;

// Chrome traces count microseconds; the fraction keeps nanoseconds.
double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string category(const char* name, bool module_category) {
  if (!module_category) return "ferry";
  std::string_view n(name);
  const std::size_t dot = n.find('.');
  return std::string(dot == std::string_view::npos ? n : n.substr(0, dot));
}

Json common(const char* ph, const Event& e, std::uint64_t ts_ns, int pid, const std::string& cat) {
  return {{"name", e.name},  {"cat", cat}, {"ph", ph},
          {"ts", us(ts_ns)}, {"pid", pid}, {"tid", e.tid}};
}

void add_args(Json* j, const Event& e) {
  Json args = e.args.is_object() ? e.args : Json::object();
  if (e.file != nullptr) {
    args["site"] = std::string(e.file) + ":" + std::to_string(e.line);
    args["function"] = e.function != nullptr ? e.function : "";
  }
  if (e.rss_end_kb != 0) {
    args["rss_begin_kb"] = e.rss_begin_kb;
    args["rss_end_kb"] = e.rss_end_kb;
  }
  if (!args.empty()) (*j)["args"] = std::move(args);
}

Json rss_counter(const Event& e, std::uint64_t ts_ns, std::uint64_t kb, int pid) {
  return {{"name", "rss_kb"}, {"ph", "C"},    {"ts", us(ts_ns)},
          {"pid", pid},       {"tid", e.tid}, {"args", {{"rss_kb", kb}}}};
}

}  // namespace

std::string dump_json(const Json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::vector<Json> event_json(const Event& e, int pid, bool module_category) {
  const std::string cat = category(e.name, module_category);
  std::vector<Json> out;
  switch (e.kind) {
    case EventKind::kSpan: {
      Json j = common("X", e, e.start_ns, pid, cat);
      j["dur"] = us(e.end_ns - e.start_ns);
      add_args(&j, e);
      out.push_back(std::move(j));
      if (e.rss_end_kb != 0) {
        out.push_back(rss_counter(e, e.start_ns, e.rss_begin_kb, pid));
        out.push_back(rss_counter(e, e.end_ns, e.rss_end_kb, pid));
      }
      break;
    }
    case EventKind::kRange: {
      // Async events: a range may cross threads and need not nest.
      const std::string id = "0x" + std::to_string(e.id);
      out.push_back(common("b", e, e.start_ns, pid, cat));
      out.push_back(common("e", e, e.end_ns, pid, cat));
      for (Json& j : out) j["id"] = id;
      break;
    }
    case EventKind::kMark: {
      Json j = common("i", e, e.start_ns, pid, cat);
      j["s"] = "t";
      add_args(&j, e);
      out.push_back(std::move(j));
      break;
    }
    case EventKind::kCounter: {
      Json j = common("C", e, e.start_ns, pid, cat);
      j["args"] = {{"value", e.value}};
      out.push_back(std::move(j));
      break;
    }
  }
  return out;
}

void TraceBuffer::add(std::vector<Event>* events, int pid, bool module_category) {
  std::stable_sort(events->begin(), events->end(),
                   [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
  for (const Event& e : *events) {
    for (const Json& j : event_json(e, pid, module_category)) {
      std::string text = dump_json(j);
      bytes_ += text.size() + 2;  // ",\n"
      lines_.push_back({j.value("ts", 0.0), std::move(text)});
    }
  }
  events->clear();
  const std::uint64_t limit = budget_ > kReserveBytes ? budget_ - kReserveBytes : 0;
  while (bytes_ > limit && !lines_.empty()) {
    bytes_ -= lines_.front().json.size() + 2;
    lines_.pop_front();
    ++budget_dropped_;
  }
}

std::string TraceBuffer::take_json(const TraceHeader& h) {
  Json ferry = {{"format", 1},
                {"rank", h.rank},
                {"role", h.role},
                {"step", h.step},
                {"task", h.task},
                {"host", h.host},
                {"pid", h.pid},
                {"wall_minus_monotonic_ns", h.wall_minus_monotonic_ns},
                {"dropped_events", dropped()}};
  if (dropped() > 0) {
    ferry["note"] = "trace truncated: " + std::to_string(budget_dropped_) +
                    " oldest events dropped to stay under the byte budget of " +
                    std::to_string(budget_) + " bytes, " + std::to_string(overflow_dropped_) +
                    " lost to full thread buffers";
  }
  // One event a line, so a large trace stays readable and is never one huge JSON value.
  std::string out =
      "{\"displayTimeUnit\":\"ms\",\n\"otherData\":" + dump_json({{"ferry", std::move(ferry)}}) +
      ",\n\"traceEvents\":[\n";
  const std::string name = "ferry " + h.role + " rank" + std::to_string(h.rank);
  out += dump_json({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", h.pid},
                    {"tid", 0},
                    {"args", {{"name", name}}}});
  if (dropped() > 0) {
    // Also an event, so the viewer shows it where the kept part begins.
    out += ",\n" + dump_json({{"name", "ferry.trace_truncated"},
                              {"ph", "i"},
                              {"s", "g"},
                              {"ts", lines_.empty() ? 0.0 : lines_.front().ts_us},
                              {"pid", h.pid},
                              {"tid", 0},
                              {"args", {{"dropped_events", dropped()}}}});
  }
  for (const Line& l : lines_) {
    out += ",\n";
    out += l.json;
  }
  out += "\n]}\n";
  lines_.clear();
  bytes_ = 0;
  budget_dropped_ = 0;
  overflow_dropped_ = 0;
  return out;
}

}  // namespace ferry::profiler
