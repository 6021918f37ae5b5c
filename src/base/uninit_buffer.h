// A byte buffer that is not zero-filled when sized. A large one comes straight from mmap, so
// its pages are touched, and count against memory, only as bytes are written into it: a
// receiver assembling a 4 GiB tensor holds what has arrived, not 4 GiB at the first segment.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace ferry {

class UninitBuffer {
 public:
  UninitBuffer() = default;
  UninitBuffer(UninitBuffer&& other) noexcept { swap(other); }
  UninitBuffer& operator=(UninitBuffer&& other) noexcept {
    UninitBuffer(std::move(other)).swap(*this);
    return *this;
  }

  // Contents are not kept: the buffer is for bytes about to be written.
  void resize(std::size_t n) {
    if (n > capacity_) {
      data_.reset();  // the old memory goes first, so the two are never held together
      data_ = std::make_unique_for_overwrite<std::byte[]>(n);
      capacity_ = n;
    }
    size_ = n;
  }
  void swap(UninitBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace ferry
