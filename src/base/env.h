// The file operations ferry's writers use, behind one seam (as leveldb's Env), so a test can
// fail a write with ENOSPC, or an fsync or a rename, without filling a real disk.
//
// How code gets an Env: writers call Env::current(), which is Env::posix() unless a
// ScopedEnvOverride is alive. The override is process-wide, not passed in options, because
// the writers sit below public entry points (Checkpointer::save on every rank's thread,
// save_async's background thread, SafetensorsWriter) whose options structs are public: an
// Env there would put an internal type on the public API, and a thread-local override would
// miss the threads those calls start.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry {

// Every call reports failure as a Status naming the system call and the file
// (errno_status: ENOSPC and EDQUOT are kResourceExhausted). Implementations are thread-safe.
class Env {
 public:
  virtual ~Env() = default;

  // The real file system. Belongs to ferry and lives as long as the process.
  static Env& posix();
  // The Env writers use now: the newest live ScopedEnvOverride's, else posix().
  static Env& current();

  // open(2) of `path` with `flags` (O_WRONLY or O_RDWR, O_CREAT, ...) and `mode`.
  virtual Result<ScopedFd> open_for_write(const std::string& path, int flags, mode_t mode) = 0;
  // Writes all of `data` at the file offset (pwrite: at `offset`), looping over short
  // writes and EINTR. `what` names the file in errors. A failed write may have written part.
  virtual Status write(int fd, std::span<const std::byte> data, std::string_view what) = 0;
  virtual Status pwrite(int fd, std::span<const std::byte> data, std::uint64_t offset,
                        std::string_view what) = 0;
  // ftruncate(2) to `size` bytes.
  virtual Status truncate(int fd, std::uint64_t size, std::string_view what) = 0;
  // fsync(2) of an open file.
  virtual Status sync(int fd, std::string_view what) = 0;
  // fsync(2) of the folder `dir`, so that a file created or renamed in it survives a crash.
  virtual Status sync_dir(const std::string& dir) = 0;
  // rename(2): replaces `to` atomically.
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // unlink(2).
  virtual Status remove(const std::string& path) = 0;
  // mkdir -p: creates `path` and the folders above it that are missing.
  virtual Status create_dirs(const std::string& path) = 0;
};

// Forwards every call to another Env; a test's Env overrides only what it changes.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env& target) : target_(target) {}
  Env& target() const { return target_; }

  Result<ScopedFd> open_for_write(const std::string& path, int flags, mode_t mode) override {
    return target_.open_for_write(path, flags, mode);
  }
  Status write(int fd, std::span<const std::byte> data, std::string_view what) override {
    return target_.write(fd, data, what);
  }
  Status pwrite(int fd, std::span<const std::byte> data, std::uint64_t offset,
                std::string_view what) override {
    return target_.pwrite(fd, data, offset, what);
  }
  Status truncate(int fd, std::uint64_t size, std::string_view what) override {
    return target_.truncate(fd, size, what);
  }
  Status sync(int fd, std::string_view what) override { return target_.sync(fd, what); }
  Status sync_dir(const std::string& dir) override { return target_.sync_dir(dir); }
  Status rename(const std::string& from, const std::string& to) override {
    return target_.rename(from, to);
  }
  Status remove(const std::string& path) override { return target_.remove(path); }
  Status create_dirs(const std::string& path) override { return target_.create_dirs(path); }

 private:
  Env& target_;
};

// Makes `env` the Env::current() of every thread while this object lives, then restores
// the previous one. Tests only. Create and destroy it on one thread, around the calls it
// should affect, with no ferry I/O running; `env` must outlive it and every AtomicFile
// created under it (an AtomicFile keeps the Env it was created with).
class ScopedEnvOverride {
 public:
  explicit ScopedEnvOverride(Env& env);
  ~ScopedEnvOverride();
  ScopedEnvOverride(const ScopedEnvOverride&) = delete;
  ScopedEnvOverride& operator=(const ScopedEnvOverride&) = delete;

 private:
  Env* previous_;
};

}  // namespace ferry
