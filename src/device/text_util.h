// Small string helpers shared by the probes (none of them allocate more than the result).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/parse_number.h"  // parse_uint, used with these helpers

namespace ferry::device {

std::string_view trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
std::vector<std::string> split_lines(std::string_view s);
bool starts_with_ci(std::string_view s, std::string_view prefix);
// The value of `key=value` / `key: value` lines (first match, trimmed).
std::optional<std::string> find_key_value(std::string_view text, std::string_view key, char sep);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// "0,1,2,3": the mask text that selects `ids`.
std::string id_list(const std::vector<int>& ids);
std::string shell_quote(std::string_view s);

}  // namespace ferry::device
