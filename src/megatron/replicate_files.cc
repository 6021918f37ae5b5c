#include "megatron/replicate_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <vector>

#include "base/env.h"
#include "ferry/megatron.h"
#include "megatron/megatron_dist_checkpoint.h"
#if defined(__x86_64__)
// The dispatching XXH3 (AVX2 / AVX-512 where the CPU has them), as src/sync/copy.h uses.
#include <xxh_x86dispatch.h>
#endif

namespace ferry::checkpoint {
namespace replicate {

Result<Xxh3State> new_xxh3_state() {
  Xxh3State s(XXH3_createState());
  if (!s || XXH3_64bits_reset(s.get()) != XXH_OK) return internal_error("XXH3: no hash state");
  return s;
}

Result<std::uint64_t> xxh3_fd(int fd, const std::string& what, std::uint64_t* bytes) {
  auto state = new_xxh3_state();
  if (!state.ok()) return state.status();
  std::vector<std::byte> buffer(kHashReadBytes);
  std::uint64_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("pread", what, errno);
    if (n == 0) break;
    XXH3_64bits_update(state->get(), buffer.data(), static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  if (bytes != nullptr) *bytes = offset;
  return XXH3_64bits_digest(state->get());
}

Result<StreamedFile> StreamedFile::create(const std::string& root, const std::string& rel) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return errno_status("mkdir", root, ec.value());
  auto root_fd = megatron::open_root(root);
  if (!root_fd.ok()) return root_fd.status();
  StreamedFile f;
  auto dir = megatron::open_parent_beneath(root_fd->get(), root, rel, /*create=*/true);
  if (!dir.ok()) return dir.status();
  f.dir_ = std::move(*dir);
  const std::size_t slash = rel.rfind('/');
  f.name_ = slash == std::string::npos ? rel : rel.substr(slash + 1);
  f.full_ = root + "/" + rel;
  static std::atomic<unsigned> counter{0};
  f.temp_ = fmt::format(".{}.tmp.{}.{}", f.name_, ::getpid(), counter++);
  f.fd_ = ScopedFd(::openat(f.dir_.get(), f.temp_.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!f.fd_.valid()) {
    const int err = errno;
    f.temp_.clear();  // not ours to remove
    return errno_status("openat", root + "/" + rel + " (its temp file)", err);
  }
  auto hash = new_xxh3_state();
  if (!hash.ok()) return hash.status();
  f.hash_ = std::move(*hash);
  return f;
}

StreamedFile::~StreamedFile() { discard(); }

void StreamedFile::discard() {
  fd_.reset();
  if (dir_.valid() && !temp_.empty()) (void)::unlinkat(dir_.get(), temp_.c_str(), 0);
  temp_.clear();
}

Status StreamedFile::append(std::span<const std::byte> data) {
  if (!fd_.valid()) return failed_precondition(full_ + ": written after commit or discard");
  if (Status s = Env::current().write(fd_.get(), data, full_); !s.ok()) return s;
  XXH3_64bits_update(hash_.get(), data.data(), data.size());
  bytes_ += data.size();
  return ok_status();
}

std::uint64_t StreamedFile::xxh3() const { return XXH3_64bits_digest(hash_.get()); }

Status StreamedFile::commit() {
  if (!fd_.valid()) return failed_precondition(full_ + ": committed twice or after discard");
  Status s = Env::current().sync(fd_.get(), full_);
  if (s.ok() && ::renameat(dir_.get(), temp_.c_str(), dir_.get(), name_.c_str()) != 0) {
    s = errno_status("renameat", full_, errno);
  }
  if (!s.ok()) {
    discard();
    return s;
  }
  temp_.clear();  // it is the target now
  fd_.reset();
  (void)::fsync(dir_.get());
  return ok_status();
}

}  // namespace replicate

Result<std::uint64_t> xxh3_file(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open", path, errno);
  return replicate::xxh3_fd(fd.get(), path);
}

}  // namespace ferry::checkpoint
