// Forked helper processes for the benchmark and the demo: each runs a function and sends
// its result back as text through a pipe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/subprocess.h"
#include "ferry/status.h"

namespace ferry::tools {

// Forks a child that runs `body` and writes its returned text to the pipe, then exits. The
// child is killed if the returned Subprocess is destroyed before finish_child().
Result<Subprocess> fork_child(const std::function<std::string()>& body,
                              const std::string& what = "tools child");
// Reads everything the child wrote and reaps it; an error naming it when a signal killed it.
Result<std::string> finish_child(Subprocess& child);

// Peak resident set of this process (VmHWM), in bytes.
std::uint64_t peak_rss_bytes();

// CPU seconds this process has used so far (all its threads), user and kernel apart.
struct CpuSeconds {
  double user = 0;
  double sys = 0;
  double total() const { return user + sys; }
  CpuSeconds operator-(const CpuSeconds& o) const { return {user - o.user, sys - o.sys}; }
};
CpuSeconds cpu_seconds();

}  // namespace ferry::tools
