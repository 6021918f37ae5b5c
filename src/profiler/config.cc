#include <algorithm>
#include <charconv>
#include <string>

#include "base/overrides.h"
#include "ferry/profiler.h"
#include "profiler/config_fields.h"

namespace ferry::profiler {
namespace {

constexpr std::string_view kContentNames[] = {"npu", "cpu", "memory", "shapes", "module", "stack"};
constexpr std::string_view kLevelNames[] = {"level_none", "level0", "level1", "level2"};

template <std::size_t N>
std::string join(const std::string_view (&names)[N]) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  return out;
}

Override make_override(std::string_view key, std::string_view value) {
  Override o;
  o.key = std::string(key);
  o.value = std::string(value);
  return o;
}

Result<std::int64_t> parse_int(std::string_view key, std::string_view value) {
  std::int64_t v = 0;
  const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || value.empty()) {
    return invalid_argument(std::string(key) + "=" + std::string(value) + ": expected an integer");
  }
  return v;
}

bool is_null(std::string_view v) { return v.empty() || v == "null" || v == "None" || v == "~"; }

}  // namespace

std::string_view content_name(Content c) { return kContentNames[static_cast<int>(c)]; }
std::string_view level_name(Level l) { return kLevelNames[static_cast<int>(l)]; }

Result<Content> parse_content(std::string_view text) {
  for (std::size_t i = 0; i < std::size(kContentNames); ++i) {
    if (text == kContentNames[i]) return static_cast<Content>(i);
  }
  return invalid_argument("'" + std::string(text) +
                          "' is not a profiler content; allowed: " + join(kContentNames));
}

Result<Level> parse_level(std::string_view text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
  }
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (text == kLevelNames[i]) return static_cast<Level>(i);
  }
  // The FAQ writes level=1; verl itself wants level1.
  if (text == "0" || text == "1" || text == "2") return static_cast<Level>(text[0] - '0' + 1);
  if (text == "none") return Level::kLevelNone;
  return invalid_argument("'" + std::string(text) + "' is not a profiler level; allowed: " +
                          join(kLevelNames) + " (or 0, 1, 2)");
}

bool Config::has(Content c) const {
  return std::find(contents.begin(), contents.end(), c) != contents.end();
}

bool Config::profiles_rank(int rank) const {
  if (!enable) return false;
  if (all_ranks) return true;
  if (ranks.empty()) return rank == 0;
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

Status set_npu_field(Config* c, std::string_view field, std::string_view value,
                     std::string_view key) {
  if (field == "contents") {
    std::vector<Content> contents;
    for (const std::string& item : parse_list_value(value)) {
      auto content = parse_content(item);
      if (!content.ok()) return content.status().with_context(key);
      if (std::find(contents.begin(), contents.end(), *content) == contents.end()) {
        contents.push_back(*content);
      }
    }
    c->contents = std::move(contents);
    return ok_status();
  }
  if (field == "level") {
    auto level = parse_level(value);
    if (!level.ok()) return level.status().with_context(key);
    c->level = *level;
    return ok_status();
  }
  if (field == "analysis" || field == "discrete") {
    auto b = parse_bool_value(make_override(key, value));
    if (!b.ok()) return b.status();
    (field == "analysis" ? c->analysis : c->discrete) = *b;
    return ok_status();
  }
  if (field == "profile_token_start" || field == "profile_token_end") {
    // verl's rollout-token window; ferry has no tokens, so it is checked and ignored.
    if (is_null(value)) return ok_status();
    auto v = parse_int(key, value);
    if (!v.ok()) return v.status();
    if (*v < 0) return invalid_argument(std::string(key) + ": must be >= 0");
    return ok_status();
  }
  if (field == "name") {
    if (value != "npu" && value != "\"npu\"") {
      return invalid_argument(std::string(key) + "=" + std::string(value) + ": must be npu");
    }
    return ok_status();
  }
  if (field == "_target_") return ok_status();
  return invalid_argument("unknown profiler key '" + std::string(key) +
                          "'; tool_config.npu allows: " + join(kNpuFields));
}

Status set_section_field(Config* c, std::string_view field, std::string_view value,
                         std::string_view key) {
  if (field == "enable" || field == "all_ranks") {
    auto b = parse_bool_value(make_override(key, value));
    if (!b.ok()) return b.status();
    (field == "enable" ? c->enable : c->all_ranks) = *b;
    return ok_status();
  }
  if (field == "ranks") {
    std::vector<int> ranks;
    for (const std::string& item : parse_list_value(value)) {
      auto v = parse_int(key, item);
      if (!v.ok()) return v.status();
      if (*v < 0) return invalid_argument(std::string(key) + ": rank " + item + " is negative");
      ranks.push_back(static_cast<int>(*v));
    }
    c->ranks = std::move(ranks);
    return ok_status();
  }
  if (field == "save_path") {
    if (!is_null(value)) c->save_path = std::string(value);
    return ok_status();
  }
  if (field == "tool") {
    // Any of verl's tools selects the same ferry spans; only the spelling is checked.
    constexpr std::string_view kTools[] = {"npu", "nsys", "torch", "torch_memory",
                                           "precision_debugger"};
    if (is_null(value) ||
        std::find(std::begin(kTools), std::end(kTools), value) != std::end(kTools)) {
      return ok_status();
    }
    return invalid_argument(std::string(key) + "=" + std::string(value) +
                            ": allowed: " + join(kTools));
  }
  if (field == "trace_budget_bytes") {
    auto v = parse_int(key, value);
    if (!v.ok()) return v.status();
    if (*v < 4096) return invalid_argument(std::string(key) + ": must be at least 4096 bytes");
    c->trace_budget_bytes = static_cast<std::uint64_t>(*v);
    return ok_status();
  }
  return invalid_argument("unknown profiler key '" + std::string(key) +
                          "'; the profiler section allows: " + join(kSectionFields));
}

Result<bool> apply_override(Config* config, std::string_view text) {
  auto parsed = parse_override(text);
  if (!parsed.ok()) return parsed.status();
  const Override& o = *parsed;
  const std::vector<std::string>& p = o.path;
  const std::size_t n = p.size();
  // <...>.npu.<field>: ours whatever the field, so a typo is an error, not ignored.
  if (n >= 2 && p[n - 2] == "npu" && (n == 2 || p[n - 3] == "tool_config")) {
    Status s = set_npu_field(config, p[n - 1], o.value, o.key);
    if (!s.ok()) return s;
    return true;
  }
  if (n >= 2 && p[n - 2] == "profiler" &&
      std::find(std::begin(kSectionFields), std::end(kSectionFields), p[n - 1]) !=
          std::end(kSectionFields)) {
    Status s = set_section_field(config, p[n - 1], o.value, o.key);
    if (!s.ok()) return s;
    return true;
  }
  return false;
}

Status apply_overrides(Config* config, const std::vector<std::string>& texts) {
  for (const std::string& t : texts) {
    auto r = apply_override(config, t);
    if (!r.ok()) return r.status();
  }
  return ok_status();
}

std::vector<std::string> to_verl_overrides(const Config& c, std::string_view prefix) {
  const std::string pre = prefix.empty() ? "" : std::string(prefix) + ".";
  std::string contents = "[";
  for (std::size_t i = 0; i < c.contents.size(); ++i) {
    if (i > 0) contents += ",";
    contents += content_name(c.contents[i]);
  }
  contents += "]";
  return {pre + "contents=" + contents, pre + "level=" + std::string(level_name(c.level)),
          pre + "analysis=" + (c.analysis ? "true" : "false"),
          pre + "discrete=" + (c.discrete ? "true" : "false")};
}

}  // namespace ferry::profiler
