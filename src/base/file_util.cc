#include "base/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>

#include "base/status_macros.h"

namespace ferry {

void ScopedFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

MappedRegion& MappedRegion::operator=(MappedRegion&& o) noexcept {
  if (this != &o) {
    reset();
    addr_ = o.addr_;
    size_ = o.size_;
    o.addr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedRegion::reset() {
  if (addr_ != nullptr && size_ > 0) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

Result<MappedFile> map_file_readonly(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file");
  MappedFile out{path, {}};
  if (st.st_size == 0) return out;
  void* addr =
      ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return errno_status("mmap", path, errno);
  out.region = MappedRegion(addr, static_cast<std::size_t>(st.st_size));
  return out;
}

Result<std::string> read_file(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open", path, errno);
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("read", path, errno);
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

Status write_all(int fd, std::span<const std::byte> data, std::string_view what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("write", what, errno);
    data = data.subspan(static_cast<std::size_t>(n));
  }
  return Status();
}

Status pwrite_all(int fd, std::span<const std::byte> data, std::uint64_t offset,
                  std::string_view what) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("pwrite", what, errno);
    data = data.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return Status();
}

Status read_exact(int fd, std::span<std::byte> out, std::string_view what) {
  while (!out.empty()) {
    ssize_t n = ::read(fd, out.data(), out.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("read", what, errno);
    if (n == 0) return corruption(std::string(what) + ": unexpected end of file");
    out = out.subspan(static_cast<std::size_t>(n));
  }
  return Status();
}

}  // namespace ferry
