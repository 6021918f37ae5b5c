// Recognises known error messages with patterns from explain_patterns.json.
// A pattern is a cheap substring filter plus an optional regex whose groups
// fill {placeholders} in the title, cause and fix; a few patterns name a
// "compute" step (the bucket size, a folder name) that derives more. When a
// value is missing from the text, the *_fallback wording is used instead, so
// no "{name}" is ever printed.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
// GCC 12 with -fsanitize=address reports a false maybe-uninitialized inside
// libstdc++'s <regex> (std::function in its NFA states); nothing in this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>

#include "device/probes.h"
#include "device/text_util.h"
#include "ferry/model.h"
#include "ferry/tensor.h"

namespace ferry::device {
namespace {

// libstdc++'s regex recurses per character; long lines are cut before matching.
constexpr std::size_t kMaxLine = 4096;

using Vars = std::map<std::string, std::string>;

struct Pattern {
  std::string id, title, cause, title_fallback, cause_fallback, compute;
  std::vector<std::string> contains, groups, fix, fix_fallback;
  std::optional<std::regex> regex;
};

bool placeholder_char(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

// Fills each {name} from `vars`. A name with no value is counted in *missing
// and written as <name>, the "fill this in" form the fixes already use.
std::string substitute(const std::string& text, const Vars& vars, int* missing = nullptr) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] == '{') {
      std::size_t close = i + 1;
      while (close < text.size() && placeholder_char(text[close])) ++close;
      if (close < text.size() && text[close] == '}' && close > i + 1) {
        const std::string name = text.substr(i + 1, close - i - 1);
        auto it = vars.find(name);
        if (it != vars.end()) {
          out += it->second;
        } else {
          out += "<" + name + ">";
          if (missing) ++*missing;
        }
        i = close + 1;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

// The title, cause and fix of `pat` filled from `vars`; false when a value is missing.
bool fill(const std::string& title, const std::string& cause, const std::vector<std::string>& fix,
          const Vars& vars, Explanation* e) {
  int missing = 0;
  e->title = substitute(title, vars, &missing);
  e->cause = substitute(cause, vars, &missing);
  e->fix.clear();
  for (const std::string& f : fix) e->fix.push_back(substitute(f, vars, &missing));
  return missing == 0;
}

std::vector<std::string> strings(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  if (j[key].is_string()) return {j[key].get<std::string>()};
  for (const auto& v : j[key]) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

Result<std::vector<Pattern>> load_patterns(const std::string& dir) {
  auto text = load_data_file(dir, "explain_patterns.json");
  if (!text.ok()) return text.status();
  const std::string where =
      (dir.empty() ? std::string("(built-in)") : dir) + "/explain_patterns.json";
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.contains("patterns") || !j["patterns"].is_array()) {
    return corruption(where + ": not JSON with a \"patterns\" array");
  }
  std::vector<Pattern> patterns;
  for (const auto& p : j["patterns"]) {
    if (!p.is_object() || !p.contains("id") || !p.contains("cause")) {
      return corruption(where + ": each pattern needs \"id\" and \"cause\"");
    }
    Pattern pat;
    pat.id = p["id"].get<std::string>();
    pat.title = p.value("title", pat.id);
    pat.cause = p["cause"].get<std::string>();
    pat.compute = p.value("compute", "");
    pat.title_fallback = p.value("title_fallback", pat.title);
    pat.cause_fallback = p.value("cause_fallback", pat.cause);
    pat.contains = strings(p, "contains");
    pat.groups = strings(p, "groups");
    pat.fix = strings(p, "fix");
    pat.fix_fallback = strings(p, "fix_fallback");
    if (pat.contains.empty() && !p.contains("regex")) {
      return corruption(where + ": pattern " + pat.id + " needs \"contains\" or \"regex\"");
    }
    if (p.contains("regex")) {
      try {
        pat.regex.emplace(p["regex"].get<std::string>(), std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return corruption(where + ": pattern " + pat.id + " has a bad regex: " + e.what());
      }
    }
    patterns.push_back(std::move(pat));
  }
  return patterns;
}

// Tensor bytes from "torch.Size([151936, 4096])" and "torch.float32", then
// advise-bucket's number for it.
bool compute_bucket(Vars* vars) {
  const auto shape_it = vars->find("shape");
  const auto dtype_it = vars->find("dtype");
  if (shape_it == vars->end() || dtype_it == vars->end() || dtype_it->second.empty()) return false;
  std::vector<std::int64_t> dims;
  for (const std::string& d : split(shape_it->second, ',')) {
    if (trim(d).empty()) continue;
    auto n = parse_uint(trim(d));
    if (!n) return false;
    dims.push_back(*n);
  }
  auto dtype = parse_dtype(dtype_it->second);
  if (!dtype.ok()) return false;
  auto elements = element_count(dims, "tensor shape");
  if (!elements.ok()) return false;
  auto bytes = byte_size(*dtype, *elements, "tensor");
  if (!bytes.ok()) return false;
  auto advice = model::advise_bucket(*bytes);
  if (!advice.ok()) return false;
  char mib[64];
  std::snprintf(mib, sizeof(mib), "%.1f", advice->largest_mb);
  std::string shape_x;
  for (std::size_t i = 0; i < dims.size(); ++i) shape_x += (i ? "x" : "") + std::to_string(dims[i]);
  (*vars)["shape_x"] = shape_x;
  (*vars)["bytes"] = std::to_string(*bytes);
  (*vars)["tensor_mib"] = mib;
  (*vars)["element_bytes"] = std::to_string(dtype_bits(*dtype) / 8);
  (*vars)["advised_mib"] = std::to_string(advice->bucket_mb);
  (*vars)["override"] = advice->override_line;
  if (vars->find("bucket_mib") == vars->end() || (*vars)["bucket_mib"].empty()) {
    (*vars)["bucket_mib"] = "2048";  // verl's default, when the message does not say
  }
  return true;
}

// "/ckpt/global_step_10/actor/common.pt" -> dir "/ckpt/global_step_10/actor".
bool compute_dirname(Vars* vars) {
  const std::string path = (*vars)["path"];
  const std::size_t slash = path.rfind('/');
  (*vars)["dir"] =
      slash == std::string::npos || slash == 0 ? "/path/to/ckpt" : path.substr(0, slash);
  return slash != std::string::npos && slash != 0;
}

}  // namespace

Result<std::vector<Explanation>> explain(std::string_view text, const std::string& data_dir) {
  auto patterns = load_patterns(data_dir);
  if (!patterns.ok()) return patterns.status();
  std::vector<Explanation> found;
  std::vector<bool> done(patterns->size(), false);
  for (std::string line : split_lines(text)) {
    if (line.size() > kMaxLine) line.resize(kMaxLine);
    for (std::size_t p = 0; p < patterns->size(); ++p) {
      if (done[p]) continue;
      const Pattern& pat = (*patterns)[p];
      bool hit = pat.contains.empty();
      for (const std::string& c : pat.contains) {
        if (line.find(c) != std::string::npos) hit = true;
      }
      if (!hit) continue;
      Vars vars;
      if (pat.regex) {
        std::smatch m;
        if (!std::regex_search(line, m, *pat.regex)) continue;
        for (std::size_t g = 0; g < pat.groups.size() && g + 1 < m.size(); ++g) {
          if (m[g + 1].matched) vars[pat.groups[g]] = m[g + 1].str();  // else: missing
        }
      }
      bool computed = true;
      if (pat.compute == "bucket") computed = compute_bucket(&vars);
      if (pat.compute == "dirname") computed = compute_dirname(&vars);
      Explanation e;
      e.id = pat.id;
      e.matched = std::string(trim(line));
      if (!computed || !fill(pat.title, pat.cause, pat.fix, vars, &e)) {
        fill(pat.title_fallback, pat.cause_fallback,
             pat.fix_fallback.empty() ? pat.fix : pat.fix_fallback, vars, &e);
      }
      found.push_back(std::move(e));
      done[p] = true;
    }
  }
  return found;
}

}  // namespace ferry::device
