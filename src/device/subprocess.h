// Runs a tool with a deadline and captures what it prints.
#pragma once

#include <string>
#include <vector>

#include "ferry/device.h"

namespace ferry::device {

// Finds `name` on the colon-separated `path_var` ("" when it is not there).
// A name with a slash is taken as a path.
std::string find_on_path(const std::string& name, const std::string& path_var);

// Runs `argv` (argv[0] already resolved to a file) in its own process group,
// stdin from /dev/null; the whole group is killed once `timeout_ms` passes.
Result<ToolResult> run_with_timeout(const std::vector<std::string>& argv, int timeout_ms);

}  // namespace ferry::device
