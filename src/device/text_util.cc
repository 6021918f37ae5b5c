#include "device/text_util.h"

#include <cctype>
#include <limits>

namespace ferry::device {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep, start);
    out.emplace_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return out;
}

std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> lines = split(s, '\n');
  for (std::string& l : lines) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
  }
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> find_key_value(std::string_view text, std::string_view key, char sep) {
  for (const std::string& line : split_lines(text)) {
    std::string_view l = trim(line);
    if (!starts_with_ci(l, key)) continue;
    std::string_view rest = trim(l.substr(key.size()));
    if (rest.empty() || rest.front() != sep) continue;
    return std::string(trim(rest.substr(1)));
  }
  return std::nullopt;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string id_list(const std::vector<int>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == ',' || c == '.' || c == '_' ||
          c == '-' || c == '/' || c == ':' || c == '=')) {
      plain = false;
    }
  }
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace ferry::device
