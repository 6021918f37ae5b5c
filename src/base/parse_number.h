// Whole decimal numbers from text that users or files supply (device masks, step folders,
// tracker files), parsed strictly: a typo must not become a number.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ferry {

// A whole non-negative decimal number, or nullopt: digits only (no sign, no spaces), at
// most 18 of them, so the value always fits.
inline std::optional<std::int64_t> parse_uint(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace ferry
