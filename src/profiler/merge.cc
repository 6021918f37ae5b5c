// Several processes' traces as one timeline: what discrete=false means across the workers
// of a node (and, aligned by wall clock, across nodes).
#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "ferry/profiler.h"

namespace ferry::profiler {

Status merge_traces(const std::vector<std::string>& paths, const std::string& out_path) {
  if (paths.empty()) return invalid_argument("no trace files given to merge");
  using Json = nlohmann::json;
  Json merged = Json::array();
  Json sources = Json::array();
  bool have_base = false;
  std::int64_t base_anchor = 0;
  std::string base_host;
  for (const std::string& path : paths) {
    auto text = read_file(path);
    if (!text.ok()) return text.status();
    Json doc = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") ||
        !doc["traceEvents"].is_array()) {
      return corruption(path + ": not a Chrome trace (no traceEvents array)");
    }
    // Shift each file onto the first file's clock, by the wall-clock anchors.
    double shift_us = 0;
    const Json* ferry = nullptr;
    if (doc.contains("otherData") && doc["otherData"].is_object() &&
        doc["otherData"].contains("ferry")) {
      ferry = &doc["otherData"]["ferry"];
    }
    if (ferry != nullptr && ferry->contains("wall_minus_monotonic_ns") &&
        (*ferry)["wall_minus_monotonic_ns"].is_number_integer()) {
      const std::int64_t anchor = (*ferry)["wall_minus_monotonic_ns"].get<std::int64_t>();
      const std::string host = ferry->contains("host") && (*ferry)["host"].is_string()
                                   ? (*ferry)["host"].get<std::string>()
                                   : "";
      if (!have_base) {
        base_anchor = anchor;
        base_host = host;
        have_base = true;
      }
      // One node shares CLOCK_MONOTONIC: the anchors differ only by sampling jitter there.
      if (host.empty() || host != base_host) {
        shift_us = static_cast<double>(anchor - base_anchor) / 1000.0;
      }
    }
    for (Json& e : doc["traceEvents"]) {
      if (e.is_object() && e.contains("ts") && e["ts"].is_number() && shift_us != 0) {
        e["ts"] = e["ts"].get<double>() + shift_us;
      }
      merged.push_back(std::move(e));
    }
    sources.push_back({{"path", path},
                       {"shift_us", shift_us},
                       {"ferry", ferry != nullptr ? *ferry : Json::object()}});
  }
  Json out = {{"displayTimeUnit", "ms"},
              {"otherData", {{"ferry_merged", sources}}},
              {"traceEvents", std::move(merged)}};
  return write_file_atomic(out_path, out.dump() + "\n");
}

}  // namespace ferry::profiler
