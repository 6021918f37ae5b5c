#include "delta/runs.h"

#include <cstdint>
#include <cstring>
#include <string>

namespace ferry::delta {
namespace {

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The first index >= pos where the two differ, or n: whole words first, since sparse
// updates leave most words equal.
std::size_t next_difference(const std::byte* a, const std::byte* b, std::size_t pos,
                            std::size_t n) {
  while (pos + 8 <= n && load_u64(a + pos) == load_u64(b + pos)) pos += 8;
  while (pos < n && a[pos] == b[pos]) ++pos;
  return pos;
}

void put_varint(std::vector<std::byte>* out, std::uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<std::byte>(v));
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
  const std::size_t limit = cap > SIZE_MAX - base ? SIZE_MAX : base + cap;
  std::size_t last_end = 0;
  *runs = 0;
  for (std::size_t start = next_difference(a, b, 0, n); start < n;
       start = next_difference(a, b, last_end, n)) {
    std::size_t end = start + 1;
    for (;;) {
      while (end < n && a[end] != b[end]) ++end;
      std::size_t k = end;
      while (k < n && k - end <= kMaxMergedGap && a[k] == b[k]) ++k;
      if (k >= n || k - end > kMaxMergedGap) break;
      end = k;  // a short stretch of equal bytes, then more changes: one run
    }
    put_varint(out, start - last_end);
    put_varint(out, end - start);
    if (out->size() + (end - start) > limit) return false;
    out->insert(out->end(), b + start, b + end);
    ++*runs;
    last_end = end;
  }
  return true;
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
