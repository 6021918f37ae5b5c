#include "delta/runs.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ferry::delta {
namespace {

static_assert(std::endian::native == std::endian::little,
              "byte i of a loaded word must be the byte at offset i");

// The encoder looks at 64 bytes at a time as a mask, bit i for byte i: runs start and end at
// its bit transitions, found with ctz, so a run costs a few bit operations and no
// byte-by-byte loop or mispredicted branch per byte.
constexpr std::size_t kChunk = 64;

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Bit i set when byte i of `x` is not zero. The add carries into each byte's high bit unless
// its low 7 bits are zero; the multiply gathers the 8 high bits into the top byte (no two
// partial products meet, so nothing carries).
std::uint64_t nonzero_bytes(std::uint64_t x) {
  constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  const std::uint64_t high = (((x & kLow7) + kLow7) | x) & ~kLow7;
  return (high * 0x0002040810204081ULL) >> 56;
}

// Bit i set when byte pos + i differs, for the chunk [pos, pos + 64) that lies inside the
// segment. SSE2 (every x86-64) compares 16 bytes an instruction; elsewhere 8-byte XORs.
inline std::uint64_t changed_mask(const std::byte* a, const std::byte* b) {
#if defined(__SSE2__)
  auto equal = [&](std::size_t k) {
    return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k)));
  };
  auto bits = [](__m128i e) { return static_cast<std::uint64_t>(_mm_movemask_epi8(e)); };
  return ~(bits(equal(0)) | bits(equal(16)) << 16 | bits(equal(32)) << 32 | bits(equal(48)) << 48);
#else
  std::uint64_t mask = 0;
  for (std::size_t k = 0; k < kChunk; k += 8) {
    mask |= nonzero_bytes(load_u64(a + k) ^ load_u64(b + k)) << k;
  }
  return mask;
#endif
}

// The same for the last, partial chunk [pos, n); 0 past n.
std::uint64_t changed_mask_tail(const std::byte* a, const std::byte* b, std::size_t pos,
                                std::size_t n) {
  std::uint64_t mask = 0;
  std::size_t k = 0;
  for (; pos + k + 8 <= n; k += 8) {
    mask |= nonzero_bytes(load_u64(a + pos + k) ^ load_u64(b + pos + k)) << k;
  }
  for (; pos + k < n; ++k) mask |= static_cast<std::uint64_t>(a[pos + k] != b[pos + k]) << k;
  return mask;
}

inline std::uint64_t changed_mask(const std::byte* a, const std::byte* b, std::size_t pos,
                                  std::size_t n) {
  return pos + kChunk <= n ? changed_mask(a + pos, b + pos) : changed_mask_tail(a, b, pos, n);
}

// The first chunk start >= pos (pos a chunk start) whose chunk holds a changed byte, the
// start of the last, partial chunk, or n. Most chunks of a sparse update have none: this
// loop ORs their XORs and tests once, cheaper than building their masks.
std::size_t next_changed_chunk(const std::byte* a, const std::byte* b, std::size_t pos,
                               std::size_t n) {
  for (; pos + kChunk <= n; pos += kChunk) {
#if defined(__SSE2__)
    auto differ = [&](std::size_t k) {
      return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + pos + k)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + pos + k)));
    };
    const __m128i any =
        _mm_or_si128(_mm_or_si128(differ(0), differ(16)), _mm_or_si128(differ(32), differ(48)));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(any, _mm_setzero_si128())) != 0xffff) return pos;
#else
    std::uint64_t any = 0;
    for (std::size_t k = 0; k < kChunk; k += 8)
      any |= load_u64(a + pos + k) ^ load_u64(b + pos + k);
    if (any != 0) return pos;
#endif
  }
  return std::min(pos, n);
}

// The bytes of a chunk that belong to a run: the changed ones, and the equal ones in a gap
// of at most kMaxMergedGap between changed bytes (a changed byte at i-1 and i+1, at i-1 and
// i+2, or at i-2 and i+1). `before` and `after` are the neighbouring chunks' changed masks.
std::uint64_t run_bytes(std::uint64_t changed, std::uint64_t before, std::uint64_t after) {
  static_assert(kMaxMergedGap == 2, "run_bytes fills gaps of 1 and 2 bytes");
  const std::uint64_t at_minus_1 = (changed << 1) | (before >> 63);
  const std::uint64_t at_minus_2 = (changed << 2) | (before >> 62);
  const std::uint64_t at_plus_1 = (changed >> 1) | (after << 63);
  const std::uint64_t at_plus_2 = (changed >> 2) | (after << 62);
  return changed | (at_minus_1 & (at_plus_1 | at_plus_2)) | (at_minus_2 & at_plus_1);
}

constexpr std::size_t kMaxVarintBytes = 10;
// A short payload is copied as one 16-byte block, not by a variable-length memcpy call: the
// room reserved allows it, and the excess is overwritten or trimmed.
constexpr std::size_t kShortCopy = 16;

std::byte* put_varint(std::byte* w, std::uint64_t v) {
  while (v >= 0x80) {
    *w++ = static_cast<std::byte>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  *w++ = static_cast<std::byte>(v);
  return w;
}

// Appends runs to the body through a raw pointer into room grown geometrically ahead:
// per-byte push_back was most of the old encoder's time on dense-ish updates.
class RunWriter {
 public:
  RunWriter(std::span<const std::byte> current, std::size_t cap, std::vector<std::byte>* out)
      : current_(current), budget_(cap), out_(out), base_(out->size()) {
    w_ = room_end_ = out->data() + base_;
  }

  // Appends [start, end); false when the body would pass the cap.
  [[gnu::always_inline]] bool add(std::size_t start, std::size_t end) {
    const std::size_t length = end - start;
    const std::size_t room = 2 * kMaxVarintBytes + std::max(length, kShortCopy);
    if (static_cast<std::size_t>(room_end_ - w_) < room) grow(room);
    std::byte* const payload = put_varint(put_varint(w_, start - last_end_), length);
    const auto bytes = static_cast<std::size_t>(payload - w_) + length;
    if (bytes > budget_) return false;
    if (length <= kShortCopy && start + kShortCopy <= current_.size()) {
      std::memcpy(payload, current_.data() + start, kShortCopy);
    } else {
      std::memcpy(payload, current_.data() + start, length);
    }
    w_ = payload + length;
    budget_ -= bytes;
    last_end_ = end;
    ++runs_;
    return true;
  }
  // Bytes left under the cap: a run that long cannot fit.
  std::size_t budget() const { return budget_; }
  // Trims the body to what was written.
  void finish() { out_->resize(written()); }
  std::uint64_t runs() const { return runs_; }

 private:
  std::size_t written() const { return static_cast<std::size_t>(w_ - out_->data()); }
  [[gnu::noinline]] void grow(std::size_t room) {
    const std::size_t size = written();
    out_->resize(std::max(size + room, 2 * (out_->size() - base_) + 4096));
    w_ = out_->data() + size;
    room_end_ = out_->data() + out_->size();
  }

  std::span<const std::byte> current_;
  std::size_t budget_;  // cap minus the bytes written
  std::vector<std::byte>* out_;
  std::size_t base_;
  std::byte* w_;  // the next byte to write
  std::byte* room_end_;
  std::size_t last_end_ = 0;
  std::uint64_t runs_ = 0;
};

// Runs over the whole segment, chunk by chunk; false when the body would pass the cap.
bool write_runs(std::span<const std::byte> previous, std::span<const std::byte> current,
                RunWriter* writer) {
  const std::byte* a = previous.data();
  const std::byte* b = current.data();
  const std::size_t n = current.size();
  std::uint64_t before = 0;  // changed bytes of the previous chunk
  std::uint64_t changed = changed_mask(a, b, 0, n);
  bool open = false;  // a run reaches the end of the previous chunk
  std::size_t run_start = 0;
  for (std::size_t pos = 0; pos < n;) {
    if (changed == 0 && !open) {  // no run here: skip to the next chunk with a change
      pos = next_changed_chunk(a, b, pos + kChunk, n);
      before = 0;
      changed = pos < n ? changed_mask(a, b, pos, n) : 0;
      continue;
    }
    const std::uint64_t after = pos + kChunk < n ? changed_mask(a, b, pos + kChunk, n) : 0;
    const std::uint64_t in_run = run_bytes(changed, before, after);
    if (open && (in_run & 1) == 0) {
      if (!writer->add(run_start, pos)) return false;
      open = false;
    }
    // Run starts: in a run, the byte before not; ends: in a run, the byte after not (bit 63
    // is left open: the next chunk says whether the run goes on).
    std::uint64_t starts = in_run & ~((in_run << 1) | (open ? 1 : 0));
    std::uint64_t ends = in_run & ~(in_run >> 1) & ~(std::uint64_t{1} << 63);
    for (;;) {
      if (!open) {
        if (starts == 0) break;
        run_start = pos + static_cast<std::size_t>(__builtin_ctzll(starts));
        starts &= starts - 1;
        open = true;
      }
      if (ends == 0) break;
      const std::size_t end = pos + static_cast<std::size_t>(__builtin_ctzll(ends)) + 1;
      ends &= ends - 1;
      if (!writer->add(run_start, end)) return false;
      open = false;
    }
    if (open && pos + kChunk - run_start > writer->budget()) return false;  // cannot fit
    before = changed;
    changed = after;
    pos += kChunk;
  }
  return !open || writer->add(run_start, n);
}

}  // namespace

bool encode_runs(std::span<const std::byte> previous, std::span<const std::byte> current,
                 std::size_t cap, std::vector<std::byte>* out, std::uint64_t* runs) {
  RunWriter writer(current, cap, out);
  const bool fits = write_runs(previous, current, &writer);
  writer.finish();
  *runs = writer.runs();
  return fits;
}

namespace {

// Reads one LEB128 varint at body[*pos]; false if truncated, longer than 10 bytes, over
// 64 bits or overlong (a needless zero final byte).
bool get_varint_slow(std::span<const std::byte> body, std::size_t* pos, std::uint64_t* value) {
  std::uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (*pos >= body.size()) return false;
    const auto b = static_cast<std::uint8_t>(body[(*pos)++]);
    if (i == 9 && b > 1) return false;
    v |= static_cast<std::uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      if (b == 0 && i > 0) return false;
      *value = v;
      return true;
    }
  }
  return false;
}

// The same, with the one- and two-byte cases (the lengths and gaps of a sparse update:
// below 128 and 16384) inline.
[[gnu::always_inline]] inline bool get_varint(std::span<const std::byte> body, std::size_t* pos,
                                              std::uint64_t* value) {
  if (*pos + 2 <= body.size()) {
    const auto b0 = static_cast<std::uint8_t>(body[*pos]);
    const auto b1 = static_cast<std::uint8_t>(body[*pos + 1]);
    if (b0 < 0x80) {
      *value = b0;
      *pos += 1;
      return true;
    }
    if (b1 < 0x80 && b1 != 0) {  // b1 == 0 would be overlong: the slow path refuses it
      *value = (b0 & 0x7fu) | (std::uint64_t{b1} << 7);
      *pos += 2;
      return true;
    }
  }
  return get_varint_slow(body, pos, value);
}

// Copies a run's payload. Up to 16 bytes (most runs of a sparse update) by two fixed-size
// copies that overlap in the middle and write nothing outside [0, n), not a memcpy call.
[[gnu::always_inline]] inline void copy_run(std::byte* to, const std::byte* from, std::size_t n) {
  if (n > 16) {
    std::memcpy(to, from, n);
  } else if (n >= 8) {
    std::memcpy(to, from, 8);
    std::memcpy(to + n - 8, from + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(to, from, 4);
    std::memcpy(to + n - 4, from + n - 4, 4);
  } else if (n >= 2) {
    std::memcpy(to, from, 2);
    std::memcpy(to + n - 2, from + n - 2, 2);
  } else if (n == 1) {
    *to = *from;
  }
}

}  // namespace

Status check_runs(std::span<const std::byte> body, std::uint64_t runs, std::uint64_t segment_bytes,
                  std::string_view what) {
  auto bad = [&](std::uint64_t run, const std::string& why) {
    return corruption("delta for " + std::string(what) + ": run " + std::to_string(run) + " of " +
                      std::to_string(runs) + ": " + why);
  };
  std::size_t pos = 0;
  std::uint64_t offset = 0;  // where the previous run ended
  for (std::uint64_t i = 0; i < runs; ++i) {
    std::uint64_t gap = 0, length = 0;
    if (!get_varint(body, &pos, &gap)) return bad(i, "malformed or truncated gap");
    if (!get_varint(body, &pos, &length)) return bad(i, "malformed or truncated length");
    if (i > 0 && gap == 0) return bad(i, "touches the previous run (gap 0)");
    if (length == 0) return bad(i, "empty run");
    if (gap > segment_bytes - offset || length > segment_bytes - offset - gap) {
      return bad(i, "bytes [" + std::to_string(offset) + "+" + std::to_string(gap) + ", +" +
                        std::to_string(length) + ") pass the segment's " +
                        std::to_string(segment_bytes) + " bytes");
    }
    if (length > body.size() - pos) {
      return bad(i, "truncated: " + std::to_string(length) + " bytes announced, " +
                        std::to_string(body.size() - pos) + " left");
    }
    pos += length;
    offset += gap + length;
  }
  if (pos != body.size()) {
    return corruption("delta for " + std::string(what) + ": " + std::to_string(body.size() - pos) +
                      " trailing bytes after " + std::to_string(runs) + " runs");
  }
  return Status();
}

void apply_runs(std::span<const std::byte> body, std::uint64_t runs,
                std::span<std::byte> destination) {
  std::size_t pos = 0;
  std::uint64_t offset = 0;
  for (std::uint64_t i = 0; i < runs; ++i) {
    std::uint64_t gap = 0, length = 0;
    get_varint(body, &pos, &gap);
    get_varint(body, &pos, &length);
    offset += gap;
    copy_run(destination.data() + offset, body.data() + pos, length);
    pos += length;
    offset += length;
  }
}

}  // namespace ferry::delta
