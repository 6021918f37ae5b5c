// JSON string escaping for the trace writer and span arguments (no allocation beyond `out`).
#pragma once

#include <string>
#include <string_view>

namespace ferry::profiler {

// Appends `text` as a quoted JSON string.
void append_json_string(std::string* out, std::string_view text);

}  // namespace ferry::profiler
