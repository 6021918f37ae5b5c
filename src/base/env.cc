#include "base/env.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

namespace ferry {
namespace {

class PosixEnv final : public Env {
 public:
  Result<ScopedFd> open_for_write(const std::string& path, int flags, mode_t mode) override {
    ScopedFd fd(::open(path.c_str(), flags, mode));
    if (!fd.valid()) return errno_status("open", path, errno);
    return fd;
  }
  Status write(int fd, std::span<const std::byte> data, std::string_view what) override {
    return write_all(fd, data, what);
  }
  Status pwrite(int fd, std::span<const std::byte> data, std::uint64_t offset,
                std::string_view what) override {
    return pwrite_all(fd, data, offset, what);
  }
  Status truncate(int fd, std::uint64_t size, std::string_view what) override {
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      return errno_status("ftruncate", what, errno);
    return Status();
  }
  Status sync(int fd, std::string_view what) override {
    if (::fsync(fd) != 0) return errno_status("fsync", what, errno);
    return Status();
  }
  Status sync_dir(const std::string& dir) override {
    ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return errno_status("open", dir, errno);
    return sync(fd.get(), dir);
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("rename", to, errno);
    return Status();
  }
  Status remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return errno_status("unlink", path, errno);
    return Status();
  }
  Status create_dirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return errno_status("mkdir", path, ec.value());
    return Status();
  }
};

std::atomic<Env*> g_override{nullptr};

}  // namespace

Env& Env::posix() {
  static PosixEnv* env = new PosixEnv;  // never destroyed: writers may run during exit
  return *env;
}

Env& Env::current() {
  Env* env = g_override.load(std::memory_order_acquire);
  return env != nullptr ? *env : posix();
}

ScopedEnvOverride::ScopedEnvOverride(Env& env)
    : previous_(g_override.exchange(&env, std::memory_order_acq_rel)) {}

ScopedEnvOverride::~ScopedEnvOverride() { g_override.store(previous_, std::memory_order_release); }

}  // namespace ferry
