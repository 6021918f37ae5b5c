// Summaries of Chrome trace JSON: per span name count, total, mean, p50, p99, max, share.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "ferry/profiler.h"

namespace ferry::profiler {
namespace {

using Json = nlohmann::json;

struct Parsed {
  TraceFileInfo info;
  bool has_anchor = false;
  std::int64_t anchor_ns = 0;  // wall - monotonic
  std::map<std::string, std::vector<double>> durations_us;
};

double number(const Json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string text(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

Result<Parsed> parse_trace(std::string_view json_text, std::string_view source) {
  const std::string src(source);
  Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return corruption(src + ": not valid JSON");
  const Json* events = nullptr;
  if (doc.is_array()) {
    events = &doc;  // the JSON Array Format
  } else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
    events = &doc["traceEvents"];
  } else {
    return corruption(src + ": neither a traceEvents object nor an event array");
  }
  Parsed p;
  p.info.path = src;
  if (doc.is_object() && doc.contains("otherData") && doc["otherData"].is_object() &&
      doc["otherData"].contains("ferry") && doc["otherData"]["ferry"].is_object()) {
    const Json& f = doc["otherData"]["ferry"];
    p.info.rank = static_cast<int>(number(f, "rank", -1));
    p.info.role = text(f, "role");
    p.info.step = static_cast<std::int64_t>(number(f, "step", -1));
    p.info.host = text(f, "host");
    p.info.dropped_events = static_cast<std::uint64_t>(number(f, "dropped_events", 0));
    if (f.contains("wall_minus_monotonic_ns") && f["wall_minus_monotonic_ns"].is_number()) {
      p.has_anchor = true;
      p.anchor_ns = f["wall_minus_monotonic_ns"].get<std::int64_t>();
    }
  }
  double first = std::numeric_limits<double>::infinity(), last = -first;
  // Open async ranges by (cat, id, name), as the trace format matches them.
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> open;
  for (const Json& e : *events) {
    if (!e.is_object()) continue;
    const std::string ph = text(e, "ph");
    if (ph == "M" || !e.contains("ts")) continue;
    const double ts = number(e, "ts");
    const std::string name = text(e, "name");
    if (ph == "X") {
      const double dur = number(e, "dur");
      p.durations_us[name].push_back(dur);
      first = std::min(first, ts);
      last = std::max(last, ts + dur);
    } else if (ph == "b" || ph == "e") {
      auto key = std::make_tuple(text(e, "cat"), text(e, "id"), name);
      first = std::min(first, ts);
      last = std::max(last, ts);
      if (ph == "b") {
        open[key].push_back(ts);
      } else if (auto it = open.find(key); it != open.end() && !it->second.empty()) {
        p.durations_us[name].push_back(ts - it->second.back());
        it->second.pop_back();
      }
    } else if (ph == "i" || ph == "I" || ph == "C") {
      if (name == "ferry.trace_truncated") continue;
      first = std::min(first, ts);
      last = std::max(last, ts);
    }
  }
  p.info.extent_us = last > first ? last - first : 0;
  return p;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const std::size_t i = rank < 1 ? 0 : static_cast<std::size_t>(rank) - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

Summary combine(std::vector<Parsed> parsed) {
  Summary s;
  std::map<std::string, std::vector<double>> all;
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    Parsed& p = parsed[i];
    if (p.has_anchor && parsed[0].has_anchor) {
      // monotonic_i = wall - anchor_i, so file i's clock reads (anchor_0 - anchor_i) ahead.
      p.info.clock_offset_us = static_cast<double>(parsed[0].anchor_ns - p.anchor_ns) / 1000.0;
    }
    s.step_us += p.info.extent_us;
    for (auto& [name, d] : p.durations_us) all[name].insert(all[name].end(), d.begin(), d.end());
    s.files.push_back(std::move(p.info));
  }
  for (auto& [name, d] : all) {
    std::sort(d.begin(), d.end());
    SpanStats st;
    st.name = name;
    st.count = d.size();
    for (double v : d) st.total_us += v;
    st.mean_us = d.empty() ? 0 : st.total_us / static_cast<double>(d.size());
    st.p50_us = percentile(d, 0.50);
    st.p99_us = percentile(d, 0.99);
    st.max_us = d.empty() ? 0 : d.back();
    st.share = s.step_us > 0 ? st.total_us / s.step_us : 0;
    s.spans.push_back(std::move(st));
  }
  std::stable_sort(s.spans.begin(), s.spans.end(),
                   [](const SpanStats& a, const SpanStats& b) { return a.total_us > b.total_us; });
  return s;
}

std::string fmt(double v, int decimals = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

}  // namespace

Result<Summary> summarize_text(std::string_view json_text, std::string_view source_name) {
  auto p = parse_trace(json_text, source_name);
  if (!p.ok()) return p.status();
  std::vector<Parsed> v;
  v.push_back(std::move(*p));
  return combine(std::move(v));
}

Result<Summary> summarize_files(const std::vector<std::string>& paths) {
  if (paths.empty()) return invalid_argument("no trace files given");
  std::vector<Parsed> parsed;
  for (const std::string& path : paths) {
    auto text = read_file(path);
    if (!text.ok()) return text.status();
    auto p = parse_trace(*text, path);
    if (!p.ok()) return p.status();
    parsed.push_back(std::move(*p));
  }
  return combine(std::move(parsed));
}

std::string summary_markdown(const Summary& s) {
  std::string out = "# ferry trace summary\n\n";
  out += "| file | rank | role | step | extent ms | clock offset us | dropped events |\n";
  out += "|---|---|---|---|---|---|---|\n";
  for (const TraceFileInfo& f : s.files) {
    out += "| " + f.path + " | " + std::to_string(f.rank) + " | " + f.role + " | " +
           std::to_string(f.step) + " | " + fmt(f.extent_us / 1000.0) + " | " +
           fmt(f.clock_offset_us, 1) + " | " + std::to_string(f.dropped_events) + " |\n";
  }
  out += "\nstep time (sum over files): " + fmt(s.step_us / 1000.0) + " ms\n\n";
  out += "| span | count | total ms | mean us | p50 us | p99 us | max us | share of step |\n";
  out += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const SpanStats& st : s.spans) {
    out += "| " + st.name + " | " + std::to_string(st.count) + " | " + fmt(st.total_us / 1000.0) +
           " | " + fmt(st.mean_us) + " | " + fmt(st.p50_us) + " | " + fmt(st.p99_us) + " | " +
           fmt(st.max_us) + " | " + fmt(st.share * 100.0, 1) + "% |\n";
  }
  return out;
}

Status write_summary_files(const Summary& s, const std::string& prefix) {
  FERRY_RETURN_IF_ERROR(write_file_atomic(prefix + ".md", summary_markdown(s)));
  return write_file_atomic(prefix + ".csv", summary_csv(s));
}

std::string summary_csv(const Summary& s) {
  std::string out = "span,count,total_us,mean_us,p50_us,p99_us,max_us,share\n";
  for (const SpanStats& st : s.spans) {
    std::string name = st.name;
    if (name.find_first_of(",\"\n") != std::string::npos) {
      std::string q = "\"";
      for (char c : name) q += c == '"' ? std::string("\"\"") : std::string(1, c);
      name = q + "\"";
    }
    out += name + "," + std::to_string(st.count) + "," + fmt(st.total_us) + "," + fmt(st.mean_us) +
           "," + fmt(st.p50_us) + "," + fmt(st.p99_us) + "," + fmt(st.max_us) + "," +
           fmt(st.share, 6) + "\n";
  }
  return out;
}

std::string summary_json(const Summary& s) {
  Json j;
  j["step_us"] = s.step_us;
  j["files"] = Json::array();
  for (const TraceFileInfo& f : s.files) {
    j["files"].push_back({{"path", f.path},
                          {"rank", f.rank},
                          {"role", f.role},
                          {"step", f.step},
                          {"host", f.host},
                          {"extent_us", f.extent_us},
                          {"clock_offset_us", f.clock_offset_us},
                          {"dropped_events", f.dropped_events}});
  }
  j["spans"] = Json::array();
  for (const SpanStats& st : s.spans) {
    j["spans"].push_back({{"name", st.name},
                          {"count", st.count},
                          {"total_us", st.total_us},
                          {"mean_us", st.mean_us},
                          {"p50_us", st.p50_us},
                          {"p99_us", st.p99_us},
                          {"max_us", st.max_us},
                          {"share", st.share}});
  }
  return j.dump(2) + "\n";
}

}  // namespace ferry::profiler
