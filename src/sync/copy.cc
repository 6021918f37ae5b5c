#include "sync/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ferry::sync {
namespace {

// Bytes copied and then hashed at a time: small enough to stay in L2 between the two.
constexpr std::size_t kHashChunkBytes = 128u << 10;

void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__x86_64__)
  if (n < 128) {  // too short to align and stream (a chunk's tail)
    std::memcpy(dst, src, n);
  } else {
    // Align the destination to 64 bytes with an ordinary copy, stream whole lines, finish
    // the tail with an ordinary copy.
    const std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    const std::size_t lines = n / 64;
    for (std::size_t i = 0; i < lines; ++i) {
      const auto* s = reinterpret_cast<const __m128i*>(src + i * 64);
      auto* d = reinterpret_cast<__m128i*>(dst + i * 64);
      const __m128i a = _mm_loadu_si128(s);
      const __m128i b = _mm_loadu_si128(s + 1);
      const __m128i c = _mm_loadu_si128(s + 2);
      const __m128i e = _mm_loadu_si128(s + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
    // Streaming stores are weakly ordered: fence before anyone is told the bytes are there.
    _mm_sfence();
    std::memcpy(dst + lines * 64, src + lines * 64, n - lines * 64);
  }
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n == 0) return;  // an empty tensor's data() may be null, which memcpy must not get
  if (n >= kStreamingCopyBytes) {
    stream_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

void BucketHash::hash_slot_until(std::uint64_t offset) {
  if (offset > hashed_) XXH3_64bits_update(&state_, slot_ + hashed_, offset - hashed_);
  hashed_ = offset;
}

void BucketHash::copy_piece(std::byte* dst, const std::byte* src, std::size_t n,
                            std::uint64_t bucket_offset) {
  hash_slot_until(bucket_offset);
  if (n < kStreamingCopyBytes) {
    if (n != 0) {
      std::memcpy(dst, src, n);
      XXH3_64bits_update(&state_, src, n);
    }
  } else {
    for (std::size_t done = 0; done < n; done += kHashChunkBytes) {
      const std::size_t c = n - done < kHashChunkBytes ? n - done : kHashChunkBytes;
      stream_copy(dst + done, src + done, c);
      XXH3_64bits_update(&state_, src + done, c);
    }
  }
  hashed_ = bucket_offset + n;
}

std::uint64_t BucketHash::finish(std::uint64_t used) {
  hash_slot_until(used);
  return XXH3_64bits_digest(&state_);
}

}  // namespace ferry::sync
