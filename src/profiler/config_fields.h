// The one place a profiler field is set from text, shared by overrides and YAML.
#pragma once

#include <string_view>

#include "ferry/profiler.h"

namespace ferry::profiler {

// Fields of verl's tool_config.npu that ferry knows.
inline constexpr std::string_view kNpuFields[] = {
    "contents",          "level", "analysis", "discrete", "profile_token_start",
    "profile_token_end", "name",  "_target_"};
// Fields of verl's profiler section that ferry reads (others are verl's business).
inline constexpr std::string_view kSectionFields[] = {
    "enable", "all_ranks", "ranks", "save_path", "tool", "trace_budget_bytes"};

// Sets tool_config.npu.<field> from `value`; `key` names the setting in errors.
Status set_npu_field(Config* c, std::string_view field, std::string_view value,
                     std::string_view key);
// Sets profiler.<field>; same contract.
Status set_section_field(Config* c, std::string_view field, std::string_view value,
                         std::string_view key);

}  // namespace ferry::profiler
