#include "device/subprocess.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "base/subprocess.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string find_on_path(const std::string& name, const std::string& path_var) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  for (const std::string& dir : split(path_var, ':')) {
    // An empty PATH entry means the current folder, as execvp reads it.
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

Result<ToolResult> run_with_timeout(const std::vector<std::string>& argv, int timeout_ms) {
  if (argv.empty()) return invalid_argument("run_with_timeout: empty argv");
  SpawnOptions options;
  // Its own process group, so a timeout also kills what the tool started.
  options.own_process_group = true;
  auto tool = Subprocess::spawn(argv, options);
  if (!tool.ok()) return tool.status();
  Subprocess::Finished done = tool->finish(Deadline(std::chrono::milliseconds(timeout_ms)));
  ToolResult result;
  result.exit_code = done.exit.code;
  result.timed_out = done.exit.timed_out;
  result.out = std::move(done.out);
  result.err = std::move(done.err);
  return result;
}

}  // namespace ferry::device
