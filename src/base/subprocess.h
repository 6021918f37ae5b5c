// Child processes with an owner: start a program (or fork a function), read what it prints,
// wait with a deadline. A child still running when its Subprocess is destroyed is killed
// (SIGKILL) and reaped, so an early return never leaves one behind.
//
//   FERRY_ASSIGN_OR_RETURN(Subprocess tool, Subprocess::spawn({"nvidia-smi", "-L"}));
//   const Subprocess::Finished done = tool.finish(Deadline(std::chrono::seconds(5)));
//   if (done.exit.timed_out) ...
//
// Not thread-safe: one thread owns a Subprocess.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry {

// Where the child's stdout and stderr go.
enum class ChildOutput {
  kInherit,   // the parent's own stdout and stderr
  kSeparate,  // a pipe each: Finished::out and Finished::err
  kMerged,    // one pipe for both: Finished::out, read_line()
};

struct SpawnOptions {
  // "NAME=value" entries added to the environment; they win over inherited ones.
  std::vector<std::string> env;
  // Give the child only `env`, nothing inherited from this process.
  bool clear_env = false;
  // Environment variables starting with this prefix are not inherited ("" drops none):
  // tests start `ferry` without the FERRY_* settings of the shell that runs them.
  std::string drop_inherited_prefix;
  ChildOutput output = ChildOutput::kSeparate;
  // The child leads a process group of its own and kill() signals the whole group, so what
  // it started dies with it (a tool that forks helpers).
  bool own_process_group = false;
};

// How a child ended.
struct ExitStatus {
  int code = -1;           // its exit code, or 128 + the signal that killed it (as shells say)
  int signal = 0;          // the signal that killed it; 0 when it exited
  bool timed_out = false;  // finish() killed it because the deadline passed
};

class Subprocess {
 public:
  // What finish() read and how the child ended.
  struct Finished {
    ExitStatus exit;
    std::string out;  // stdout (both streams with ChildOutput::kMerged)
    std::string err;  // stderr with ChildOutput::kSeparate
  };

  // Starts argv[0] with argv, stdin from /dev/null. A name without a slash is looked up on
  // PATH. kNotFound naming the program when there is no such executable.
  static Result<Subprocess> spawn(const std::vector<std::string>& argv,
                                  const SpawnOptions& options = {});
  // Forks a child that runs body(out_fd) and exits with what it returns; what it writes to
  // out_fd is read through out (finish(), read_line()). Its stdout and stderr are this
  // process's. `what` names the child in errors. The child is a copy of this process: body
  // must not rely on other threads (they do not exist there).
  static Result<Subprocess> fork(const std::function<int(int out_fd)>& body,
                                 const std::string& what);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // kill() when still running

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // One line of its output, without the newline. At end of output: the unterminated rest,
  // or kNotFound when nothing is left; kTimeout when the deadline passes first.
  Result<std::string> read_line(Deadline deadline);

  // Reads its output until the child closes it, then reaps the child. When the deadline
  // passes first, the child (its group with own_process_group) is SIGKILLed and
  // exit.timed_out is set. Each stream keeps at most `max_bytes`; the rest is read and
  // dropped, so a chatty child never blocks on a full pipe.
  Finished finish(Deadline deadline = Deadline::never(), std::size_t max_bytes = kMaxCapture);

  // Waits for the child to exit without reading its output; nullopt while it runs on at the
  // deadline. Reaps it: later calls return the same status.
  std::optional<ExitStatus> wait(Deadline deadline);

  // Sends `sig` to the child (its group with own_process_group) unless it was reaped.
  void signal(int sig);
  // SIGKILL and reap.
  void kill();

  static constexpr std::size_t kMaxCapture = std::size_t{4} << 20;

 private:
  Subprocess(pid_t pid, std::string name, bool group, ScopedFd out, ScopedFd err)
      : pid_(pid),
        name_(std::move(name)),
        group_(group),
        out_(std::move(out)),
        err_(std::move(err)) {}

  pid_t pid_ = -1;
  std::string name_;
  bool group_ = false;
  ScopedFd out_;
  ScopedFd err_;
  std::string pending_;  // read from out_ but not yet returned by read_line()
  std::optional<ExitStatus> exited_;
};

}  // namespace ferry
