#include "sync/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ferry::sync {

void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n == 0) return;  // an empty tensor's data() may be null, which memcpy must not get
#if defined(__x86_64__)
  if (n >= kStreamingCopyBytes) {
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
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace ferry::sync
