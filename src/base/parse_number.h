// Whole numbers from text that users, files or peers supply (device masks, step folders,
// tracker files, manifests), parsed one way, strictly: a typo must not become a number, and
// nothing throws (std::stoll and friends throw, skip spaces and ignore trailing text).
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry {

// `s` as a T, or nullopt: the whole of `s` is digits of `base` (no spaces, no "0x", no '+';
// a '-' only for a signed T) and the value fits in T.
template <std::integral T>
std::optional<T> parse_number(std::string_view s, int base = 10) {
  T value{};
  const char* end = s.data() + s.size();
  const auto [stop, error] = std::from_chars(s.data(), end, value, base);
  if (s.empty() || error != std::errc() || stop != end) return std::nullopt;
  return value;
}

// As parse_number, with an invalid_argument error that names `field` and quotes the text.
template <std::integral T>
Result<T> parse_number_field(std::string_view field, std::string_view s, int base = 10) {
  if (auto v = parse_number<T>(s, base)) return *v;
  return invalid_argument(std::string(field) + ": '" + std::string(s.substr(0, 64)) +
                          "' is not a " + (base == 16 ? "hexadecimal" : "whole") +
                          " number that fits in " + std::to_string(sizeof(T) * 8) + " bits");
}

// A whole non-negative decimal number that fits in int64, or nullopt (no sign at all).
inline std::optional<std::int64_t> parse_uint(std::string_view s) {
  if (!s.empty() && s[0] == '-') return std::nullopt;
  return parse_number<std::int64_t>(s);
}

}  // namespace ferry
