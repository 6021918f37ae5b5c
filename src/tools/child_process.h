// Forked helper processes for the benchmark and the demo: each runs a function
// and sends its result back as text through a pipe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // read end of the child's result pipe
};

// Forks a child that runs `body` and writes its returned text to the pipe, then _exits.
Result<Child> fork_child(const std::function<std::string()>& body);
// Reads everything the child wrote and reaps it; an error when it died by a signal.
Result<std::string> finish_child(Child child);

// Peak resident set of this process (VmHWM), in bytes.
std::uint64_t peak_rss_bytes();

}  // namespace ferry::tools
