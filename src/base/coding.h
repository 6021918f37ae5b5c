// Fixed-width little-endian encoding, written byte by byte so the layout never
// depends on the host's endianness or on struct padding (as leveldb's util/coding.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::coding {

// Writes v little-endian into dst[0..4) / dst[0..8): for fixed layouts on the stack, where
// a vector's allocation would cost more than the bytes (the sync path's per-bucket fields).
inline void encode_u32(std::byte* dst, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void encode_u64(std::byte* dst, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<std::byte>(v >> (8 * i));
}

inline void put_u8(std::vector<std::byte>* out, std::uint8_t v) {
  out->push_back(static_cast<std::byte>(v));
}
inline void put_u16(std::vector<std::byte>* out, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<std::byte>(v >> (8 * i)));
}
inline void put_u32(std::vector<std::byte>* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<std::byte>(v >> (8 * i)));
}
inline void put_u64(std::vector<std::byte>* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<std::byte>(v >> (8 * i)));
}
inline void put_bytes(std::vector<std::byte>* out, std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out->insert(out->end(), p, p + s.size());
}

// Reads fields in order from a buffer; every read checks the bytes left, and a
// failed read leaves the reader failed so callers check once at the end.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  bool ok() const { return ok_; }
  std::size_t remaining() const { return in_.size() - pos_; }

  std::uint8_t u8() { return static_cast<std::uint8_t>(fixed(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(fixed(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(fixed(4)); }
  std::uint64_t u64() { return fixed(8); }
  // A string of exactly n bytes; empty (and failed) if fewer remain.
  std::string bytes(std::size_t n) {
    if (!take(n)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_ - n), n);
    return s;
  }

 private:
  bool take(std::size_t n) {
    if (!ok_ || remaining() < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::uint64_t fixed(int n) {
    if (!take(static_cast<std::size_t>(n))) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      v |= static_cast<std::uint64_t>(
               in_[pos_ - static_cast<std::size_t>(n) + static_cast<std::size_t>(i)])
           << (8 * i);
    }
    return v;
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace ferry::coding
