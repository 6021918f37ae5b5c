#include <fmt/format.h>

#include "ferry/sync.h"

namespace ferry::sync {

std::string_view delta_mode_name(DeltaMode mode) {
  switch (mode) {
    case DeltaMode::kOff:
      return "off";
    case DeltaMode::kOn:
      return "on";
    case DeltaMode::kAuto:
      return "auto";
  }
  return "unknown";
}

Result<DeltaMode> parse_delta_mode(std::string_view text) {
  for (DeltaMode m : {DeltaMode::kOff, DeltaMode::kOn, DeltaMode::kAuto}) {
    if (text == delta_mode_name(m)) return m;
  }
  return invalid_argument(fmt::format("delta mode '{}': expected off, on or auto", text));
}

}  // namespace ferry::sync
