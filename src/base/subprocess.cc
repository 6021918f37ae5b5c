#include "base/subprocess.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <thread>
#include <utility>

extern char** environ;

namespace ferry {
namespace {

struct Pipe {
  ScopedFd read;
  ScopedFd write;
};

Result<Pipe> make_pipe(const std::string& what) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status("pipe2", what, errno);
  return Pipe{ScopedFd(fds[0]), ScopedFd(fds[1])};
}

std::string_view variable_name(std::string_view entry) { return entry.substr(0, entry.find('=')); }

std::vector<std::string> child_environment(const SpawnOptions& options) {
  std::vector<std::string> env = options.env;
  if (options.clear_env) return env;
  const std::string& drop = options.drop_inherited_prefix;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!drop.empty() && entry.starts_with(drop)) continue;
    // An overridden variable is left out, not listed twice: getenv() takes the first entry
    // of a name but a shell the last.
    const bool overridden = std::any_of(
        options.env.begin(), options.env.end(),
        [&](const std::string& mine) { return variable_name(mine) == variable_name(entry); });
    if (!overridden) env.emplace_back(entry);
  }
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

ExitStatus decode(int wait_status) {
  ExitStatus s;
  if (WIFEXITED(wait_status)) {
    s.code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
    s.code = 128 + s.signal;
  }
  return s;
}

Status spawn_error(const std::string& program, int err) {
  if (err == ENOENT) {
    return not_found(program.find('/') == std::string::npos
                         ? fmt::format("cannot run '{}': not found on PATH", program)
                         : fmt::format("cannot run '{}': no such file", program));
  }
  return errno_status("posix_spawnp", program, err);
}

// Appends what one read() gets, up to `max_bytes` kept; false at end of stream or on error.
bool read_some(int fd, std::string* sink, std::size_t max_bytes) {
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 && errno == EAGAIN;
    const std::size_t room = max_bytes - std::min(max_bytes, sink->size());
    sink->append(buf, std::min(room, static_cast<std::size_t>(n)));
    return true;
  }
}

}  // namespace

Result<Subprocess> Subprocess::spawn(const std::vector<std::string>& argv,
                                     const SpawnOptions& options) {
  if (argv.empty() || argv[0].empty()) return invalid_argument("spawn: no program to run");
  const std::string& program = argv[0];
  std::optional<Pipe> out, err;
  if (options.output != ChildOutput::kInherit) {
    auto p = make_pipe(program);
    if (!p.ok()) return p.status();
    out = std::move(*p);
  }
  if (options.output == ChildOutput::kSeparate) {
    auto p = make_pipe(program);
    if (!p.ok()) return p.status();
    err = std::move(*p);
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (out) posix_spawn_file_actions_adddup2(&actions, out->write.get(), 1);
  if (options.output == ChildOutput::kMerged) {
    posix_spawn_file_actions_adddup2(&actions, out->write.get(), 2);
  }
  if (err) posix_spawn_file_actions_adddup2(&actions, err->write.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (options.own_process_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  std::vector<std::string> args = argv;
  std::vector<std::string> env = child_environment(options);
  std::vector<char*> argp = pointers(args);
  std::vector<char*> envp = pointers(env);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, program.c_str(), &actions, &attr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return spawn_error(program, rc);
  return Subprocess(pid, program, options.own_process_group,
                    out ? std::move(out->read) : ScopedFd(),
                    err ? std::move(err->read) : ScopedFd());
}

Result<Subprocess> Subprocess::fork(const std::function<int(int out_fd)>& body,
                                    const std::string& what) {
  auto p = make_pipe(what);
  if (!p.ok()) return p.status();
  const pid_t pid = ::fork();
  if (pid < 0) return errno_status("fork", what, errno);
  if (pid == 0) {
    p->read.reset();
    ::_exit(body(p->write.get()));
  }
  return Subprocess(pid, what, false, std::move(p->read), ScopedFd());
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      name_(std::move(other.name_)),
      group_(other.group_),
      out_(std::move(other.out_)),
      err_(std::move(other.err_)),
      pending_(std::move(other.pending_)),
      exited_(std::exchange(other.exited_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    kill();
    pid_ = std::exchange(other.pid_, -1);
    name_ = std::move(other.name_);
    group_ = other.group_;
    out_ = std::move(other.out_);
    err_ = std::move(other.err_);
    pending_ = std::move(other.pending_);
    exited_ = std::exchange(other.exited_, std::nullopt);
  }
  return *this;
}

Subprocess::~Subprocess() { kill(); }

Result<std::string> Subprocess::read_line(Deadline deadline) {
  std::size_t eol;
  while ((eol = pending_.find('\n')) == std::string::npos && out_.valid()) {
    if (deadline.passed()) return timeout_error(fmt::format("no line from {} in time", name_));
    pollfd p{out_.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(deadline.left().count()));
    if (n < 0 && errno != EINTR) return errno_status("poll", name_, errno);
    if (n > 0 && !read_some(out_.get(), &pending_, std::string::npos)) out_.reset();
  }
  if (eol == std::string::npos) {
    if (pending_.empty()) return not_found(fmt::format("{} closed its output", name_));
    return std::exchange(pending_, std::string());
  }
  std::string line = pending_.substr(0, eol);
  pending_.erase(0, eol + 1);
  return line;
}

Subprocess::Finished Subprocess::finish(Deadline deadline, std::size_t max_bytes) {
  Finished done;
  done.out = std::exchange(pending_, std::string());
  ScopedFd* fds[2] = {&out_, &err_};
  std::string* sinks[2] = {&done.out, &done.err};
  bool timed_out = false;
  while (out_.valid() || err_.valid()) {
    if (deadline.passed()) {
      timed_out = true;
      break;
    }
    pollfd p[2];
    for (int i = 0; i < 2; ++i) p[i] = {fds[i]->get(), POLLIN, 0};  // fd -1 is skipped
    const int n = ::poll(p, 2, static_cast<int>(deadline.left().count()));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd >= 0 && p[i].revents != 0 && !read_some(p[i].fd, sinks[i], max_bytes)) {
        fds[i]->reset();
      }
    }
  }
  // The output is closed, but the child may still be exiting (or have closed it early).
  std::optional<ExitStatus> exit = timed_out ? std::nullopt : wait(deadline);
  if (!exit) {
    kill();
    exit = exited_;
    if (exit) exit->timed_out = true;
  }
  done.exit = exit.value_or(ExitStatus{});
  out_.reset();
  err_.reset();
  return done;
}

std::optional<ExitStatus> Subprocess::wait(Deadline deadline) {
  while (!exited_ && pid_ > 0) {
    int status = 0;
    const pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      exited_ = decode(status);
    } else if (got < 0 && errno != EINTR) {
      exited_ = ExitStatus{};  // not our child any more: nothing left to wait for
    } else if (deadline.passed()) {
      return std::nullopt;
    } else {
      std::this_thread::sleep_for(std::min(deadline.left(), std::chrono::milliseconds(5)));
    }
  }
  return exited_;
}

void Subprocess::signal(int sig) {
  if (pid_ > 0 && !exited_) ::kill(group_ ? -pid_ : pid_, sig);
}

void Subprocess::kill() {
  if (pid_ <= 0 || exited_) return;
  signal(SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = decode(status);
}

}  // namespace ferry
