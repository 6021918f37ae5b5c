// The installed stack against the version matrix (data/device/version_matrix.json).
#include <cctype>
#include <nlohmann/json.hpp>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

// "core_r0.12.1" / "core_v0.12.1" / "v0.18.0" -> "0.12.1"; "2.9.0+cpu" -> "2.9.0".
std::string normalize(std::string_view v) {
  v = trim(v);
  for (std::string_view p : {"core_r", "core_v", "releases/v", "v"}) {
    if (v.size() > p.size() && v.substr(0, p.size()) == p &&
        std::isdigit(static_cast<unsigned char>(v[p.size()]))) {
      v.remove_prefix(p.size());
      break;
    }
  }
  return std::string(v.substr(0, v.find('+')));
}

bool prefix_match(const std::string& wanted, const std::string& installed) {
  if (installed == wanted) return true;
  // "2.9.0.post2" is a build of 2.9.0; "2.10.0" is not one of "2.1".
  return installed.size() > wanted.size() && installed.compare(0, wanted.size(), wanted) == 0 &&
         installed[wanted.size()] == '.';
}

// Dotted compare, numbers as numbers and the rest ("RC1") as text.
int compare_versions(const std::string& a, const std::string& b) {
  const std::vector<std::string> x = split(a, '.'), y = split(b, '.');
  for (std::size_t i = 0; i < std::max(x.size(), y.size()); ++i) {
    const std::string p = i < x.size() ? x[i] : "0", q = i < y.size() ? y[i] : "0";
    const auto np = parse_uint(p), nq = parse_uint(q);
    if (np && nq) {
      if (*np != *nq) return *np < *nq ? -1 : 1;
    } else if (p != q) {
      // A release ("0") sorts after its candidates ("RC1").
      if (np) return 1;
      if (nq) return -1;
      return p < q ? -1 : 1;
    }
  }
  return 0;
}

}  // namespace

bool version_matches(std::string_view wanted, std::string_view installed) {
  const std::string w(trim(wanted));
  const std::string inst = normalize(installed);
  if (w.rfind(">=", 0) == 0) return compare_versions(inst, normalize(w.substr(2))) >= 0;
  // MindSpeed names branches "2.3.0_core_r0.12.1": its own version, then Megatron's.
  const std::size_t core = w.find("_core_r");
  if (core != std::string::npos) {
    return prefix_match(normalize(w.substr(0, core)), inst) ||
           prefix_match(normalize(w.substr(core + 1)), inst) ||
           prefix_match(w, std::string(installed));
  }
  return prefix_match(normalize(w), inst);
}

Result<std::vector<VersionSet>> load_version_matrix(const std::string& data_dir) {
  auto text = load_data_file(data_dir, "version_matrix.json");
  if (!text.ok()) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  const std::string where =
      (data_dir.empty() ? std::string("(built-in)") : data_dir) + "/version_matrix.json";
  if (j.is_discarded() || !j.contains("sets") || !j["sets"].is_array()) {
    return corruption(where + ": not JSON with a \"sets\" array");
  }
  std::vector<VersionSet> sets;
  for (const auto& s : j["sets"]) {
    if (!s.is_object() || !s.contains("name") || !s.contains("components") ||
        !s["components"].is_object()) {
      return corruption(where + ": each set needs \"name\" and a \"components\" object");
    }
    VersionSet v;
    v.name = s["name"].get<std::string>();
    v.source = s.value("source", "");
    for (const auto& [k, val] : s["components"].items()) {
      if (!val.is_string()) return corruption(where + ": " + v.name + "." + k + " is not a string");
      v.components[k] = val.get<std::string>();
    }
    sets.push_back(std::move(v));
  }
  return sets;
}

VersionVerdict check_versions(const std::vector<VersionSet>& matrix,
                              const std::map<std::string, std::string>& installed) {
  VersionVerdict verdict;
  std::size_t best_misses = SIZE_MAX;
  std::size_t best_matches = 0;
  for (const VersionSet& set : matrix) {
    std::vector<std::string> misses;
    std::size_t matches = 0;
    bool compared = false;
    for (const auto& [component, wanted] : set.components) {
      auto it = installed.find(component);
      if (it == installed.end()) continue;
      compared = true;
      if (!version_matches(wanted, it->second)) {
        misses.push_back(component + " " + it->second + " (wants " + wanted + ")");
      } else {
        ++matches;
      }
    }
    if (!compared) continue;
    verdict.checked = true;
    if (misses.empty() && verdict.exact == nullptr) verdict.exact = &set;
    // Fewest mismatches, then most agreeing components; the file lists newest
    // first, so a remaining tie goes to the newer set.
    if (misses.size() < best_misses || (misses.size() == best_misses && matches > best_matches)) {
      best_misses = misses.size();
      best_matches = matches;
      verdict.nearest = &set;
      verdict.mismatches = std::move(misses);
    }
  }
  if (verdict.exact) {
    verdict.nearest = verdict.exact;
    verdict.mismatches.clear();
  }
  return verdict;
}

}  // namespace ferry::device
