#include "delta/runs.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

namespace ferry::delta {
namespace {

static_assert(std::endian::native == std::endian::little,
              "byte i of a loaded word must be the byte at offset i");

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint64_t xor_u64(const std::byte* a, const std::byte* b) { return load_u64(a) ^ load_u64(b); }

// Bit i set when byte i of `x` is not zero (x = previous ^ current: byte i changed). The
// add carries into each byte's high bit unless its low 7 bits are zero; the multiply
// gathers the 8 high bits into the top byte (no two partial products meet, so no carries).
unsigned nonzero_bytes(std::uint64_t x) {
  constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  const std::uint64_t high = (((x & kLow7) + kLow7) | x) & ~kLow7;
  return static_cast<unsigned>((high * 0x0002040810204081ULL) >> 56);
}

// The changed bytes of [pos, pos + 8) as bits; bytes at or past n count as equal.
unsigned changed_bytes(const std::byte* a, const std::byte* b, std::size_t pos, std::size_t n) {
  if (pos + 8 <= n) return nonzero_bytes(xor_u64(a + pos, b + pos));
  unsigned changed = 0;
  for (std::size_t i = pos; i < n; ++i) changed |= static_cast<unsigned>(a[i] != b[i]) << (i - pos);
  return changed;
}

// The first index >= pos where the two differ, or n. Sparse updates leave most bytes equal:
// 32 bytes a step while they are, then 8, then the first changed byte of the word.
std::size_t next_difference(const std::byte* a, const std::byte* b, std::size_t pos,
                            std::size_t n) {
  for (; pos + 32 <= n; pos += 32) {
    const std::uint64_t any = xor_u64(a + pos, b + pos) | xor_u64(a + pos + 8, b + pos + 8) |
                              xor_u64(a + pos + 16, b + pos + 16) |
                              xor_u64(a + pos + 24, b + pos + 24);
    if (any != 0) break;
  }
  for (; pos + 8 <= n; pos += 8) {
    const std::uint64_t x = xor_u64(a + pos, b + pos);
    if (x != 0) return pos + static_cast<std::size_t>(__builtin_ctzll(x)) / 8;
  }
  while (pos < n && a[pos] == b[pos]) ++pos;
  return pos;
}

// The end of a run whose last known changed byte is from - 1: the first index p >= from
// where kMaxMergedGap + 1 equal bytes start (bytes past n count as equal), so changes
// separated by at most kMaxMergedGap equal bytes stay in one run. Eight bytes a step: the
// equal-byte bits of this word and the next, ANDed with themselves shifted by 1 and 2, mark
// where three equal bytes start. Returns `limit` (<= n) instead of any p past it.
std::size_t run_end(const std::byte* a, const std::byte* b, std::size_t from, std::size_t limit,
                    std::size_t n) {
  static_assert(kMaxMergedGap == 2, "run_end looks for 3 equal bytes");
  std::size_t pos = from;
  unsigned changed = changed_bytes(a, b, pos, n);
  for (;;) {
    const unsigned next = changed_bytes(a, b, pos + 8, n);
    const unsigned equal = ~(changed | (next << 8)) & 0xffffu;
    const unsigned starts = equal & (equal >> 1) & (equal >> 2) & 0xffu;
    if (starts != 0) return std::min(pos + static_cast<std::size_t>(__builtin_ctz(starts)), limit);
    pos += 8;
    if (pos >= limit) return limit;
    changed = next;
  }
}

// Varints and the payload are written through a raw pointer into room reserved ahead:
// per-byte push_back was most of the old encoder's time on dense-ish updates.
constexpr std::size_t kMaxVarintBytes = 10;
// Short payloads are copied as one 16-byte block (the room allows it; the excess is
// overwritten or trimmed), not through a variable-length memcpy call.
constexpr std::size_t kShortCopy = 16;

std::byte* put_varint(std::byte* w, std::uint64_t v) {
  while (v >= 0x80) {
    *w++ = static_cast<std::byte>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  *w++ = static_cast<std::byte>(v);
  return w;
}

// Reads one LEB128 varint at body[*pos]; false if truncated, longer than 10 bytes, over
// 64 bits or overlong (a needless zero final byte).
bool get_varint(std::span<const std::byte> body, std::size_t* pos, std::uint64_t* value) {
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

}  // namespace

bool encode_runs(std::span<const std::byte> previous, std::span<const std::byte> current,
                 std::size_t cap, std::vector<std::byte>* out, std::uint64_t* runs) {
  const std::byte* a = previous.data();
  const std::byte* b = current.data();
  const std::size_t n = current.size();
  const std::size_t base = out->size();
  std::size_t written = 0;  // body bytes so far, <= cap
  std::size_t last_end = 0;
  *runs = 0;
  bool fits = true;
  for (std::size_t start = next_difference(a, b, 0, n); start < n;
       start = next_difference(a, b, last_end, n)) {
    // A run longer than the room left fails the cap anyway: stop scanning at that point.
    const std::size_t end = run_end(a, b, start + 1, start + std::min(cap - written, n - start), n);
    const std::size_t length = end - start;
    const std::size_t room = 2 * kMaxVarintBytes + std::max(length, kShortCopy);
    if (out->size() - base - written < room) {
      out->resize(base + std::max(written + room, 2 * (out->size() - base) + 4096));
    }
    std::byte* const begin = out->data() + base + written;
    std::byte* w = put_varint(put_varint(begin, start - last_end), length);
    if (static_cast<std::size_t>(w - begin) + length > cap - written) {
      fits = false;
      break;
    }
    if (length <= kShortCopy && start + kShortCopy <= n) {
      std::memcpy(w, b + start, kShortCopy);
    } else {
      std::memcpy(w, b + start, length);
    }
    written += static_cast<std::size_t>(w - begin) + length;
    ++*runs;
    last_end = end;
  }
  out->resize(base + written);
  return fits;
}

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
    std::memcpy(destination.data() + offset, body.data() + pos, length);
    pos += length;
    offset += length;
  }
}

}  // namespace ferry::delta
