#include "plan/calibration.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/status_macros.h"

namespace ferry::plan {
namespace {

using Json = nlohmann::ordered_json;

// The rate fields, in file order, with where each lives in the struct.
struct RateField {
  const char* name;
  double Calibration::*member;
};
constexpr RateField kRates[] = {
    {"memcpy_gbps", &Calibration::memcpy_gbps},
    {"shm_round_gbps", &Calibration::shm_round_gbps},
    {"two_threads_gbps", &Calibration::two_threads_gbps},
    {"net_round_gbps", &Calibration::net_round_gbps},
    {"net_limit_gbps", &Calibration::net_limit_gbps},
};

std::string field_error(const std::string& field, const std::string& what) {
  return "calibration field '" + field + "': " + what;
}

// `what` names the document in errors.
Result<double> number_field(const Json& j, const std::string& field,
                            const std::string& what = "calibration") {
  auto it = j.find(field);
  if (it == j.end()) return invalid_argument(what + " field '" + field + "': missing");
  if (!it->is_number()) return invalid_argument(what + " field '" + field + "': not a number");
  return it->get<double>();
}

// A small file whole; errors name `what` and the path.
Result<std::string> read_whole(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(what + " " + path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error(what + " " + path + ": read failed");
  return text.str();
}

}  // namespace

double Calibration::net_efficiency() const {
  return std::min(1.0, net_round_gbps / net_limit_gbps);
}

Calibration default_calibration() {
  Calibration c;
  c.source = "defaults";
  c.memcpy_gbps = 17.24;
  c.shm_round_gbps = 12.07;
  c.two_threads_gbps = 21.75;
  c.net_round_gbps = 1.625;
  c.net_limit_gbps = 1.458;
  c.bytes = 988'065'536;  // qwen2.5-0.5b, bf16
  c.delta_ratios = {
      {0.001, 0.0022}, {0.01, 0.0200}, {0.0423, 0.0641}, {0.0952, 0.1603}, {1.0, 1.0}};
  return c;
}

Status validate(const Calibration& c) {
  for (const RateField& f : kRates) {
    const double v = c.*f.member;
    if (!(v > 0)) {  // also refuses NaN
      return invalid_argument(field_error(f.name, "must be > 0 GB/s, got " + std::to_string(v)));
    }
  }
  if (!(c.net_cpu_fixed_s >= 0) || !(c.net_cpu_per_node_s >= 0)) {
    return invalid_argument(
        field_error(c.net_cpu_fixed_s >= 0 ? "net_cpu_per_node_s" : "net_cpu_fixed_s",
                    "must be >= 0 seconds (0: not measured)"));
  }
  if (c.bytes == 0) return invalid_argument(field_error("bytes", "must be > 0"));
  if (c.delta_ratios.empty()) return invalid_argument(field_error("delta_ratios", "empty"));
  double previous = 0;
  for (std::size_t i = 0; i < c.delta_ratios.size(); ++i) {
    const auto [density, ratio] = c.delta_ratios[i];
    const std::string at = "delta_ratios[" + std::to_string(i) + "]";
    if (!(density > previous && density <= 1.0)) {
      return invalid_argument(field_error(at, "density must be in (0, 1] and ascending"));
    }
    if (!(ratio > 0 && ratio <= 1.5)) {
      return invalid_argument(field_error(at, "ratio must be in (0, 1.5]"));
    }
    previous = density;
  }
  return ok_status();
}

std::string calibration_to_json(const Calibration& c) {
  Json j = {{"format", kCalibrationFormat},
            {"version", kCalibrationVersion},
            {"source", c.source},
            {"measured_at", c.measured_at},
            {"load_average", c.load_average}};
  for (const RateField& f : kRates) j[f.name] = c.*f.member;
  j["net_cpu_fixed_s"] = c.net_cpu_fixed_s;
  j["net_cpu_per_node_s"] = c.net_cpu_per_node_s;
  j["bytes"] = c.bytes;
  Json ratios = Json::array();
  for (const auto& [density, ratio] : c.delta_ratios) ratios.push_back({density, ratio});
  j["delta_ratios"] = ratios;
  return j.dump(2) + "\n";
}

Result<Calibration> calibration_from_json(const std::string& text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument(std::string("calibration is not JSON: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("calibration: not a JSON object");
  if (j.value("format", "") != kCalibrationFormat) {
    return invalid_argument(
        field_error("format", std::string("must be \"") + kCalibrationFormat + "\""));
  }
  FERRY_ASSIGN_OR_RETURN(const double version, number_field(j, "version"));
  if (version != kCalibrationVersion) {
    return invalid_argument(
        field_error("version", "this ferry reads version " + std::to_string(kCalibrationVersion) +
                                   ", the file is version " + j["version"].dump()));
  }
  Calibration c;
  c.source = j.value("source", "measured");
  c.measured_at = j.value("measured_at", "");
  if (j.contains("load_average")) {
    FERRY_ASSIGN_OR_RETURN(c.load_average, number_field(j, "load_average"));
  }
  for (const RateField& f : kRates) {
    FERRY_ASSIGN_OR_RETURN(c.*f.member, number_field(j, f.name));
  }
  for (auto [name, member] : {std::pair{"net_cpu_fixed_s", &Calibration::net_cpu_fixed_s},
                              std::pair{"net_cpu_per_node_s", &Calibration::net_cpu_per_node_s}}) {
    if (j.contains(name)) {  // optional: files before them lack them
      FERRY_ASSIGN_OR_RETURN(c.*member, number_field(j, name));
    }
  }
  FERRY_ASSIGN_OR_RETURN(const double bytes, number_field(j, "bytes"));
  if (!(bytes >= 1)) return invalid_argument(field_error("bytes", "must be > 0"));
  c.bytes = static_cast<std::uint64_t>(bytes);
  auto ratios = j.find("delta_ratios");
  if (ratios == j.end()) return invalid_argument(field_error("delta_ratios", "missing"));
  if (!ratios->is_array()) {
    return invalid_argument(field_error("delta_ratios", "not an array of [density, ratio]"));
  }
  for (std::size_t i = 0; i < ratios->size(); ++i) {
    const Json& pair = (*ratios)[i];
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number()) {
      return invalid_argument(
          field_error("delta_ratios[" + std::to_string(i) + "]", "not a [density, ratio] pair"));
    }
    c.delta_ratios.emplace_back(pair[0].get<double>(), pair[1].get<double>());
  }
  FERRY_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<BenchNetRound> net_round_from_bench_json(const std::string& text) {
  const std::string doc = "net bench result";
  auto bad = [&](const std::string& field, const std::string& what) {
    return invalid_argument(doc + " field '" + field + "': " + what);
  };
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument(std::string("net bench result is not JSON: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("net bench result: not a JSON object");
  if (j.value("role", "") != "sender") {
    return bad("role",
               "must be \"sender\" (the line `ferry bench sync --net --listen ... --json` prints)");
  }
  FERRY_ASSIGN_OR_RETURN(const double nodes, number_field(j, "nodes", doc));
  if (nodes != 1)
    return bad("nodes", "a calibration takes a one-node round, this one had " + j["nodes"].dump());
  BenchNetRound r;
  FERRY_ASSIGN_OR_RETURN(r.gbps_per_node, number_field(j, "gbps_per_node", doc));
  if (!(r.gbps_per_node > 0)) return bad("gbps_per_node", "must be > 0");
  if (j.contains("perftest_gbps")) {
    FERRY_ASSIGN_OR_RETURN(r.perftest_gbps, number_field(j, "perftest_gbps", doc));
    r.perftest_gbps = std::max(0.0, r.perftest_gbps);
  }
  FERRY_ASSIGN_OR_RETURN(const double bytes, number_field(j, "bytes", doc));
  if (!(bytes >= 1)) return bad("bytes", "must be > 0");
  r.bytes = static_cast<std::uint64_t>(bytes);
  for (auto [name, member] :
       {std::pair{"sender_cpu_user_s_per_round", &BenchNetRound::sender_cpu_user},
        std::pair{"sender_cpu_sys_s_per_round", &BenchNetRound::sender_cpu_sys},
        std::pair{"node_cpu_s_per_round", &BenchNetRound::node_cpu}}) {
    if (!j.contains(name)) continue;
    FERRY_ASSIGN_OR_RETURN(r.*member, number_field(j, name, doc));
    if (!(r.*member >= 0)) return bad(name, "must be >= 0 seconds");
  }
  return r;
}

Result<BenchNetRound> read_net_round(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_whole(path, "net bench result"));
  auto r = net_round_from_bench_json(text);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

Result<Calibration> read_calibration(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_whole(path, "calibration file"));
  auto c = calibration_from_json(text);
  if (!c.ok()) return c.status().with_context(path);
  return c;
}

Status write_calibration(const std::string& path, const Calibration& c) {
  FERRY_RETURN_IF_ERROR(validate(c));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("calibration file " + path + ": cannot create");
  out << calibration_to_json(c);
  out.close();
  if (!out) return io_error("calibration file " + path + ": write failed");
  return ok_status();
}

double delta_ratio(const Calibration& c, double density) {
  const auto& t = c.delta_ratios;
  if (density <= t.front().first) return t.front().second;
  for (std::size_t i = 1; i < t.size(); ++i) {
    if (density <= t[i].first) {
      const double share = (density - t[i - 1].first) / (t[i].first - t[i - 1].first);
      return t[i - 1].second + share * (t[i].second - t[i - 1].second);
    }
  }
  return t.back().second;
}

}  // namespace ferry::plan
