#include "base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>

#include "base/env.h"
#include "base/status_macros.h"

namespace ferry {

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  Env& env = Env::current();
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FERRY_ASSIGN_OR_RETURN(ScopedFd fd,
                         env.open_for_write(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  return AtomicFile(env, path, std::move(tmp), std::move(fd));
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : env_(o.env_),
      path_(std::move(o.path_)),
      tmp_(std::exchange(o.tmp_, {})),
      fd_(std::move(o.fd_)),
      committed_(o.committed_) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    discard();
    env_ = o.env_;
    path_ = std::move(o.path_);
    tmp_ = std::exchange(o.tmp_, {});
    fd_ = std::move(o.fd_);
    committed_ = o.committed_;
  }
  return *this;
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (!committed_ && !tmp_.empty()) {
    fd_.reset();
    (void)env_->remove(tmp_);  // best effort: a leftover temp file is never taken for `path`
    tmp_.clear();
  }
}

Status AtomicFile::write(std::span<const std::byte> data) { return env_->write(fd(), data, tmp_); }

Status AtomicFile::commit() {
  FERRY_RETURN_IF_ERROR(env_->sync(fd(), tmp_));
  if (::close(fd_.release()) != 0) return errno_status("close", tmp_, errno);
  FERRY_RETURN_IF_ERROR(env_->rename(tmp_, path_));
  committed_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  return env_->sync_dir(dir);
}

Status write_file_atomic(const std::string& path, std::string_view contents) {
  FERRY_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  FERRY_RETURN_IF_ERROR(file.write(as_bytes(contents)));
  return file.commit();
}

}  // namespace ferry
