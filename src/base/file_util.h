// Small RAII owners for fds and mappings, and whole-buffer I/O with errno-
// bearing errors. Every system call failure names the call and the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry {

// Owns one file descriptor; closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Owns one mmap'ed region; unmaps it on destruction.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* addr, std::size_t size) : addr_(addr), size_(size) {}
  ~MappedRegion() { reset(); }
  MappedRegion(MappedRegion&& o) noexcept : addr_(o.addr_), size_(o.size_) {
    o.addr_ = nullptr;
    o.size_ = 0;
  }
  MappedRegion& operator=(MappedRegion&& o) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(addr_); }
  std::size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data(), size_}; }
  void reset();

 private:
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// A file mapped read-only in full. An empty file gives an empty region.
struct MappedFile {
  std::string path;
  MappedRegion region;
};
Result<MappedFile> map_file_readonly(const std::string& path);

Result<std::string> read_file(const std::string& path);

// Loops over short writes and EINTR.
Status write_all(int fd, std::span<const std::byte> data, std::string_view what);
Status pwrite_all(int fd, std::span<const std::byte> data, std::uint64_t offset,
                  std::string_view what);
Status read_exact(int fd, std::span<std::byte> out, std::string_view what);

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace ferry
