// verl/Hydra-style dotted overrides: `a.b.c=value`, parsed in one place.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

struct Override {
  std::string key;                // "actor_rollout_ref.actor.profiler.tool_config.npu.level"
  std::vector<std::string> path;  // the key split at dots
  std::string value;              // raw text after '=' (may be empty)
};

// Parses one `key=value`; `+key=value` and `++key=value` (Hydra's add/force) are accepted.
Result<Override> parse_override(std::string_view text);
Result<std::vector<Override>> parse_overrides(const std::vector<std::string>& args);

// Value helpers with errors that name the key.
Result<bool> parse_bool_value(const Override& o);
// "[a,b]" or "a,b" (Hydra wants the brackets; ferry accepts both) or "[]".
std::vector<std::string> parse_list_value(std::string_view value);

// True when `key` ends with the dotted suffix `suffix` on a component boundary.
bool key_ends_with(std::string_view key, std::string_view suffix);

}  // namespace ferry
