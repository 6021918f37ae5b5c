#include "delta/xor_zstd.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

namespace ferry::delta {
namespace {

// Big enough that zstd's per-call overhead vanishes, small enough to stay in L2.
constexpr std::size_t kChunkBytes = 256 * 1024;

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

void xor_into(const std::byte* a, const std::byte* b, std::size_t n, std::byte* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

// One context per thread, kept: creating one allocates (and faults in) its workspace,
// which cost more than compressing a sparse segment.
ZSTD_CCtx* thread_cctx(int level, std::uint64_t content_bytes) {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> owned(ZSTD_createCCtx());
  ZSTD_CCtx* cctx = owned.get();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
  // The delta header's checksum already covers the frame.
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
  ZSTD_CCtx_setPledgedSrcSize(cctx, content_bytes);
  return cctx;
}

ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> owned(ZSTD_createDCtx());
  ZSTD_DCtx* dctx = owned.get();
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters);
  return dctx;
}

// Scratch for XOR input and decoded output, kept per thread for the same reason.
std::span<std::byte> thread_scratch() {
  thread_local std::vector<std::byte> scratch(kChunkBytes);
  return scratch;
}

// Feeds `ranges` of previous XOR current through one frame into out[old size, + cap).
bool compress_ranges(std::span<const std::byte> previous, std::span<const std::byte> current,
                     std::span<const std::pair<std::size_t, std::size_t>> ranges, int level,
                     std::size_t cap, std::vector<std::byte>* out) {
  std::uint64_t total = 0;
  for (const auto& [offset, length] : ranges) total += length;
  ZSTD_CCtx* cctx = thread_cctx(level, total);
  const std::size_t start = out->size();
  out->resize(start + cap);
  ZSTD_outBuffer dst{out->data() + start, cap, 0};
  const std::span<std::byte> scratch = thread_scratch();
  std::uint64_t fed = 0;
  auto fail = [&] {
    out->resize(start);
    return false;
  };
  for (const auto& [offset, length] : ranges) {
    for (std::size_t done = 0; done < length;) {
      const std::size_t n = std::min(scratch.size(), length - done);
      xor_into(previous.data() + offset + done, current.data() + offset + done, n, scratch.data());
      done += n;
      fed += n;
      ZSTD_inBuffer src{scratch.data(), n, 0};
      const ZSTD_EndDirective mode = fed == total ? ZSTD_e_end : ZSTD_e_continue;
      for (;;) {
        const std::size_t left = ZSTD_compressStream2(cctx, &dst, &src, mode);
        if (ZSTD_isError(left)) return fail();
        const bool finished = mode == ZSTD_e_end ? left == 0 : src.pos == src.size;
        if (finished) break;
        if (dst.pos == dst.size) return fail();  // over the cap
      }
    }
  }
  if (total == 0) {  // still one (empty) frame
    ZSTD_inBuffer src{nullptr, 0, 0};
    const std::size_t left = ZSTD_compressStream2(cctx, &dst, &src, ZSTD_e_end);
    if (ZSTD_isError(left) || left != 0) return fail();
  }
  out->resize(start + dst.pos);
  return true;
}

}  // namespace

std::size_t xor_zstd_bound(std::size_t content_bytes) { return ZSTD_compressBound(content_bytes); }

bool encode_xor_zstd(std::span<const std::byte> previous, std::span<const std::byte> current,
                     int level, std::size_t cap, std::vector<std::byte>* out) {
  const std::pair<std::size_t, std::size_t> whole{0, current.size()};
  return compress_ranges(previous, current, {&whole, 1}, level, cap, out);
}

std::size_t xor_zstd_sample_size(std::span<const std::byte> previous,
                                 std::span<const std::byte> current,
                                 std::span<const std::pair<std::size_t, std::size_t>> ranges,
                                 int level) {
  std::size_t total = 0;
  for (const auto& range : ranges) total += range.second;
  std::vector<std::byte> out;
  if (!compress_ranges(previous, current, ranges, level, ZSTD_compressBound(total), &out)) {
    return ZSTD_compressBound(total);
  }
  return out.size();
}

Status check_xor_zstd(std::span<const std::byte> body, std::uint64_t segment_bytes,
                      std::string_view what) {
  auto bad = [&](const std::string& why) {
    return corruption("delta for " + std::string(what) + ": zstd frame " + why);
  };
  const unsigned long long content = ZSTD_getFrameContentSize(body.data(), body.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return bad("has a malformed header");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) return bad("does not state its content size");
  if (content != segment_bytes) {
    return bad("decodes to " + std::to_string(content) + " bytes, the segment holds " +
               std::to_string(segment_bytes));
  }
  const std::size_t frame = ZSTD_findFrameCompressedSize(body.data(), body.size());
  if (ZSTD_isError(frame)) return bad(std::string("is truncated: ") + ZSTD_getErrorName(frame));
  if (frame != body.size()) {
    return bad("is followed by " + std::to_string(body.size() - frame) + " trailing bytes");
  }
  ZSTD_DCtx* dctx = thread_dctx();
  const std::span<std::byte> scratch = thread_scratch();
  ZSTD_inBuffer src{body.data(), body.size(), 0};
  std::uint64_t decoded = 0;
  for (;;) {
    ZSTD_outBuffer dst{scratch.data(), scratch.size(), 0};
    const std::size_t left = ZSTD_decompressStream(dctx, &dst, &src);
    if (ZSTD_isError(left)) return bad(std::string("does not decode: ") + ZSTD_getErrorName(left));
    decoded += dst.pos;
    if (decoded > segment_bytes) return bad("decodes to more than the segment's bytes");
    if (left == 0) break;
    if (src.pos == src.size && dst.pos < dst.size) return bad("ends early");
  }
  if (decoded != segment_bytes) {
    return bad("decodes to " + std::to_string(decoded) + " of " + std::to_string(segment_bytes) +
               " bytes");
  }
  if (src.pos != src.size) return bad("is followed by trailing bytes");
  return Status();
}

void apply_xor_zstd(std::span<const std::byte> body, std::span<std::byte> destination) {
  ZSTD_DCtx* dctx = thread_dctx();
  const std::span<std::byte> scratch = thread_scratch();
  ZSTD_inBuffer src{body.data(), body.size(), 0};
  std::size_t offset = 0;
  for (;;) {
    ZSTD_outBuffer dst{scratch.data(), scratch.size(), 0};
    const std::size_t left = ZSTD_decompressStream(dctx, &dst, &src);
    xor_into(destination.data() + offset, scratch.data(), dst.pos, destination.data() + offset);
    offset += dst.pos;
    if (left == 0 || ZSTD_isError(left)) break;
  }
}

}  // namespace ferry::delta
