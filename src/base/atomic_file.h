// Files replaced whole or not at all, through the Env (base/env.h). Apart from file_util so
// that code which only reads files or owns fds (the CLI's tools) does not pull in Env's
// process-wide state.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry {

class Env;

// Writes a file so that a crash never leaves a partial file under `path`:
// data goes to "<path>.tmp.<pid>" in the same folder, is fsync'ed, renamed over
// `path`, and the folder is fsync'ed. Destroying an uncommitted writer removes the temp file,
// so a failed write, fsync or rename leaves `path` as it was. All I/O goes through the
// Env::current() of create() (base/env.h).
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& path);
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  ~AtomicFile();

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  Status write(std::span<const std::byte> data);
  // fsync, rename into place, fsync the folder.
  Status commit();

 private:
  void discard();
  AtomicFile(Env& env, std::string path, std::string tmp, ScopedFd fd)
      : env_(&env), path_(std::move(path)), tmp_(std::move(tmp)), fd_(std::move(fd)) {}
  Env* env_;
  std::string path_;
  std::string tmp_;
  ScopedFd fd_;
  bool committed_ = false;
};

Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace ferry
