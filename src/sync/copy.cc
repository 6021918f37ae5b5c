#include "sync/copy.h"

#include <algorithm>
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

std::uint64_t copy_selected(std::span<const SliceRun> runs, std::byte* slice, const std::byte* src,
                            std::uint64_t tensor_offset, std::uint64_t n,
                            std::uint64_t bucket_offset, BucketHash* hash) {
  const std::uint64_t end = tensor_offset + n;
  std::uint64_t copied = 0;
  for (const SliceRun& r : runs) {
    if (r.whole_offset >= end) break;  // runs are in tensor order
    const std::uint64_t stride = r.count > 1 ? r.whole_stride : 0;
    // Blocks before the piece: those ending at or before tensor_offset.
    std::uint64_t k = 0;
    if (stride != 0 && tensor_offset > r.whole_offset + r.block_bytes) {
      k = (tensor_offset - r.whole_offset - r.block_bytes) / stride + 1;
    }
    for (; k < r.count; ++k) {
      const std::uint64_t block = r.whole_offset + k * stride;
      if (block >= end) break;
      const std::uint64_t from = std::max(block, tensor_offset);
      const std::uint64_t to = std::min(block + r.block_bytes, end);
      if (from >= to) continue;
      std::byte* dst = slice + r.slice_offset + k * r.block_bytes + (from - block);
      const std::byte* at = src + (from - tensor_offset);
      if (hash != nullptr) {
        hash->copy_piece(dst, at, to - from, bucket_offset + (from - tensor_offset));
      } else {
        copy_bytes(dst, at, to - from);
      }
      copied += to - from;
    }
  }
  return copied;
}

}  // namespace ferry::sync
