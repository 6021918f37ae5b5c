#include "base/overrides.h"

#include <algorithm>
#include <cctype>

namespace ferry {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool valid_component(std::string_view c) {
  if (c.empty()) return false;
  return std::all_of(c.begin(), c.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '-' || ch == '@' || ch == '/';
  });
}

}  // namespace

Result<Override> parse_override(std::string_view text) {
  std::string_view t = trim(text);
  while (t.starts_with('+')) t.remove_prefix(1);
  const std::size_t eq = t.find('=');
  if (eq == std::string_view::npos) {
    return invalid_argument("override '" + std::string(text) +
                            "' has no '=': write key.path=value");
  }
  Override o;
  o.key = std::string(trim(t.substr(0, eq)));
  o.value = std::string(trim(t.substr(eq + 1)));
  std::string_view rest = o.key;
  while (true) {
    const std::size_t dot = rest.find('.');
    std::string_view part = rest.substr(0, dot);
    if (!valid_component(part)) {
      return invalid_argument("override '" + std::string(text) + "': key '" + o.key +
                              "' has an empty or invalid component");
    }
    o.path.emplace_back(part);
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  return o;
}

Result<std::vector<Override>> parse_overrides(const std::vector<std::string>& args) {
  std::vector<Override> out;
  for (const std::string& a : args) {
    auto o = parse_override(a);
    if (!o.ok()) return o.status();
    out.push_back(std::move(*o));
  }
  return out;
}

Result<bool> parse_bool_value(const Override& o) {
  std::string v(o.value);
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return invalid_argument(o.key + "=" + o.value + ": expected true or false");
}

std::vector<std::string> parse_list_value(std::string_view value) {
  std::string_view v = trim(value);
  if (v.size() >= 2 && v.front() == '[' && v.back() == ']') v = v.substr(1, v.size() - 2);
  std::vector<std::string> out;
  while (!trim(v).empty()) {
    const std::size_t comma = v.find(',');
    std::string_view item = trim(v.substr(0, comma));
    if (item.size() >= 2 && (item.front() == '\'' || item.front() == '"') &&
        item.back() == item.front()) {
      item = item.substr(1, item.size() - 2);
    }
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return out;
}

bool key_ends_with(std::string_view key, std::string_view suffix) {
  if (!key.ends_with(suffix)) return false;
  return key.size() == suffix.size() || key[key.size() - suffix.size() - 1] == '.';
}

}  // namespace ferry
