#include "delta/delta.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "base/status_macros.h"
#include "delta/runs.h"
#include "delta/xor_zstd.h"

namespace ferry::delta {
namespace {

// auto's sample for its estimates: this many evenly spaced pieces of this size. 64 KiB in
// all: 256 KiB cost a third of auto's encode time over a model's 290 segments (bench).
constexpr std::size_t kSamplePieces = 16;
constexpr std::size_t kSamplePieceBytes = 4 * 1024;
// The sparse-or-dense count reads only this much of each piece of a large segment: the
// strided reads cost twice their share of a scan, and 16 KiB tells 1/16 of changed words
// apart well enough.
constexpr std::size_t kCountPieceBytes = 1024;
// Below this share of changed words in the sample, runs cost about one scan: encode them
// exactly (an update concentrated away from the sample costs a slower scan, never more bytes).
constexpr std::uint64_t kExactRunsWordShare = 16;  // 1/16
// xor_zstd is estimated (a zstd pass over the sample) only when the best other encoding
// takes more than this share of dense: below it, xor_zstd could save at most that share
// of dense's bytes, and the estimate cost a fifth of auto's time on sparse updates (bench).
constexpr std::size_t kXorZstdWorthShare = 32;  // 1/32

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

Ranges sample_ranges(std::size_t n) {
  if (n <= kSamplePieces * kSamplePieceBytes) return {{0, n}};
  Ranges ranges;
  const std::size_t stride = n / kSamplePieces;
  for (std::size_t i = 0; i < kSamplePieces; ++i)
    ranges.emplace_back(i * stride, kSamplePieceBytes);
  return ranges;
}

std::size_t runs_sample_size(std::span<const std::byte> previous,
                             std::span<const std::byte> current, const Ranges& ranges) {
  std::vector<std::byte> body;
  std::uint64_t runs = 0;
  for (const auto& [offset, length] : ranges) {
    encode_runs(previous.subspan(offset, length), current.subspan(offset, length),
                std::numeric_limits<std::size_t>::max(), &body, &runs);
  }
  return body.size();
}

// Sample size scaled to the whole segment.
std::size_t scale(std::size_t sample_size, const Ranges& ranges, std::size_t n) {
  std::size_t sampled = 0;
  for (const auto& range : ranges) sampled += range.second;
  if (sampled == 0) return 0;
  return static_cast<std::size_t>(static_cast<double>(sample_size) / static_cast<double>(sampled) *
                                  static_cast<double>(n));
}

void append_dense(std::span<const std::byte> current, std::vector<std::byte>* out) {
  out->insert(out->end(), current.begin(), current.end());
}

// Encodes the body with `encoding` into `out` (which holds the header's room); false when
// the body would pass `cap`.
bool encode_body(Encoding encoding, std::span<const std::byte> previous,
                 std::span<const std::byte> current, int level, std::size_t cap,
                 std::vector<std::byte>* out, std::uint64_t* count) {
  *count = 0;
  switch (encoding) {
    case Encoding::kDense:
      append_dense(current, out);
      return true;
    case Encoding::kRuns:
      if (encode_runs(previous, current, cap, out, count)) return true;
      out->resize(kHeaderBytes);
      return false;
    case Encoding::kXorZstd:
      return encode_xor_zstd(previous, current, level, cap, out);
  }
  return false;
}

// auto: the smallest by estimate, encoded with dense's size as the cap.
Encoding encode_auto(std::span<const std::byte> previous, std::span<const std::byte> current,
                     const EncodeOptions& options, std::vector<std::byte>* out,
                     std::uint64_t* count) {
  const int level = options.zstd_level;
  const std::size_t n = current.size();
  *count = 0;
  // Differing words counted over the sample only: over the whole segment the count was a
  // second full pass, half of auto's encode time at 0.1% (bench).
  const Ranges ranges = sample_ranges(n);
  std::uint64_t sampled_words = 0, differing = 0;
  for (const auto& [offset, length] : ranges) {
    // A small segment (one range) is counted whole: it stays in cache for the encode.
    const std::size_t counted = ranges.size() == 1 ? length : std::min(length, kCountPieceBytes);
    sampled_words += (counted + 7) / 8;
    differing +=
        count_differing_words(previous.subspan(offset, counted), current.subspan(offset, counted));
  }
  // xor_zstd's estimate, when the best other encoding is worth it.
  auto xor_zstd_pays = [&](std::size_t best_other) {
    if (best_other <= n / kXorZstdWorthShare) return false;
    const std::size_t xor_estimate =
        scale(xor_zstd_sample_size(previous, current, ranges, level), ranges, n);
    return static_cast<double>(xor_estimate) <=
           options.xor_zstd_advantage * static_cast<double>(best_other);
  };
  if (differing * kExactRunsWordShare <= sampled_words) {
    // Sparse: exact runs cost little more than the scan; zstd only if its estimate is smaller.
    const bool runs_fit = encode_runs(previous, current, n, out, count);
    if (!runs_fit) {
      out->resize(kHeaderBytes);
      *count = 0;
    }
    const std::size_t best = runs_fit ? out->size() - kHeaderBytes : n;
    if (xor_zstd_pays(best)) {
      // A second buffer kept per thread (swapped with the caller's), so neither is new.
      thread_local std::vector<std::byte> spare;
      spare.resize(kHeaderBytes);
      if (encode_xor_zstd(previous, current, level, best, &spare)) {
        out->swap(spare);
        *count = 0;
        return Encoding::kXorZstd;
      }
    }
    if (runs_fit) return Encoding::kRuns;
    append_dense(current, out);
    return Encoding::kDense;
  }
  const std::size_t runs_estimate = scale(runs_sample_size(previous, current, ranges), ranges, n);
  Encoding best = runs_estimate < n ? Encoding::kRuns : Encoding::kDense;
  if (xor_zstd_pays(std::min(runs_estimate, n))) best = Encoding::kXorZstd;
  if (best != Encoding::kDense && encode_body(best, previous, current, level, n, out, count)) {
    return best;
  }
  *count = 0;
  append_dense(current, out);
  return Encoding::kDense;
}

}  // namespace

std::uint64_t count_differing_words(std::span<const std::byte> previous,
                                    std::span<const std::byte> current) {
  const std::size_t n = std::min(previous.size(), current.size());
  std::uint64_t differing = 0;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t a, b;
    std::memcpy(&a, previous.data() + i, 8);
    std::memcpy(&b, current.data() + i, 8);
    differing += a != b;
  }
  if (i < n && std::memcmp(previous.data() + i, current.data() + i, n - i) != 0) ++differing;
  return differing;
}

Result<std::vector<std::byte>> encode(std::span<const std::byte> previous,
                                      std::span<const std::byte> current,
                                      const EncodeOptions& options) {
  std::vector<std::byte> out;
  FERRY_RETURN_IF_ERROR(encode_into(previous, current, options, &out));
  return out;
}

Status encode_into(std::span<const std::byte> previous, std::span<const std::byte> current,
                   const EncodeOptions& options, std::vector<std::byte>* out_buffer) {
  if (previous.size() != current.size()) {
    return invalid_argument("delta encode: previous holds " + std::to_string(previous.size()) +
                            " bytes, current " + std::to_string(current.size()));
  }
  std::vector<std::byte>& out = *out_buffer;
  out.resize(kHeaderBytes);
  Header header;
  header.segment_bytes = current.size();
  const std::size_t unbounded = std::numeric_limits<std::size_t>::max();
  switch (options.choice) {
    case Choice::kAuto:
      header.encoding = encode_auto(previous, current, options, &out, &header.count);
      break;
    case Choice::kDense:
      header.encoding = Encoding::kDense;
      break;
    case Choice::kRuns:
      header.encoding = Encoding::kRuns;
      break;
    case Choice::kXorZstd:
      header.encoding = Encoding::kXorZstd;
      break;
  }
  if (options.choice != Choice::kAuto) {
    // A forced zstd frame may exceed dense by zstd's bound, never more.
    const std::size_t cap =
        options.choice == Choice::kXorZstd ? xor_zstd_bound(current.size()) : unbounded;
    if (!encode_body(header.encoding, previous, current, options.zstd_level, cap, &out,
                     &header.count)) {
      return internal_error("delta encode: " + std::string(encoding_name(header.encoding)) +
                            " failed within its bound of " + std::to_string(cap) + " bytes");
    }
  }
  header.body_bytes = out.size() - kHeaderBytes;
  write_header(header, std::span(out).subspan(kHeaderBytes), out.data());
  return Status();
}

Status encode_into_hashed(std::span<const std::byte> previous, std::span<const std::byte> current,
                          const EncodeOptions& options, std::vector<std::byte>* out,
                          std::uint64_t* current_hash) {
  FERRY_RETURN_IF_ERROR(encode_into(previous, current, options, out));
  // A separate pass: hashing 16 KiB blocks just behind the runs scan, while still in cache,
  // measured no faster (docs/benchmarks.md), so the encoder stays free of it.
  *current_hash = XXH3_64bits(current.data(), current.size());
  return Status();
}

Status apply(std::span<const std::byte> encoded, std::span<std::byte> destination,
             std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const Header header, read_header(encoded, destination.size(), what));
  const auto body = encoded.subspan(kHeaderBytes);
  switch (header.encoding) {
    case Encoding::kDense:
      if (body.size() != destination.size()) {
        return corruption("delta for " + std::string(what) + ": dense body holds " +
                          std::to_string(body.size()) + " bytes, the segment " +
                          std::to_string(destination.size()));
      }
      if (!body.empty()) std::memcpy(destination.data(), body.data(), body.size());
      return Status();
    case Encoding::kRuns:
      FERRY_RETURN_IF_ERROR(check_runs(body, header.count, destination.size(), what));
      apply_runs(body, header.count, destination);
      return Status();
    case Encoding::kXorZstd:
      FERRY_RETURN_IF_ERROR(check_xor_zstd(body, destination.size(), what));
      apply_xor_zstd(body, destination);
      return Status();
  }
  return internal_error("delta apply: unhandled encoding");
}

}  // namespace ferry::delta
