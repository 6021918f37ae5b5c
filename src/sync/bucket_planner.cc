#include "sync/bucket_planner.h"

#include <fmt/format.h>

#include <limits>
#include <numeric>

namespace ferry::sync {
namespace {

// Pieces are counted in u32, with the largest value kept free.
constexpr std::uint64_t kMaxPieces = std::numeric_limits<std::uint32_t>::max();

}  // namespace

std::uint64_t split_unit(DType dtype) {
  const auto bits = static_cast<std::uint64_t>(dtype_bits(dtype));
  return std::lcm(bits, std::uint64_t{8}) / 8;
}

Result<BucketPlan> plan_buckets(std::span<const TensorSpec> manifest, std::uint64_t bucket_bytes) {
  if (bucket_bytes < kPieceAlignment || bucket_bytes % kPieceAlignment != 0) {
    return invalid_argument(fmt::format("bucket_bytes {} must be a positive multiple of {}",
                                        bucket_bytes, kPieceAlignment));
  }
  if (manifest.size() >= std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument(fmt::format("{} tensors: at most 2^32-2 per round", manifest.size()));
  }
  // A manifest from a peer is untrusted: refuse a plan too large to hold before building it
  // (a 2^61-byte tensor through 16-byte buckets would loop and allocate for minutes).
  std::uint64_t pieces_at_least = manifest.size();
  for (const TensorSpec& spec : manifest) {
    pieces_at_least += spec.bytes() / bucket_bytes;
    if (pieces_at_least >= kMaxPieces) break;
  }
  if (pieces_at_least >= kMaxPieces) {
    return invalid_argument(fmt::format(
        "the plan needs more than {} pieces ({} tensors through {}-byte buckets): use a larger "
        "bucket",
        kMaxPieces - 1, manifest.size(), bucket_bytes));
  }
  BucketPlan plan;
  plan.bucket_bytes = bucket_bytes;
  plan.first_piece.reserve(manifest.size());
  plan.piece_count.reserve(manifest.size());
  plan.pieces.reserve(manifest.size());
  std::uint32_t bucket = 0;
  std::uint64_t pos = 0;  // next free byte of `bucket`
  bool bucket_open = false;
  auto close_bucket = [&] {
    plan.bucket_used.push_back(pos);
    ++bucket;
    pos = 0;
    bucket_open = false;
  };
  for (std::size_t t = 0; t < manifest.size(); ++t) {
    const TensorSpec& spec = manifest[t];
    const std::uint64_t bytes = spec.bytes();
    const std::uint64_t unit = split_unit(spec.dtype);
    const std::uint64_t align =
        std::lcm(kPieceAlignment, static_cast<std::uint64_t>(dtype_alignment(spec.dtype)));
    plan.first_piece.push_back(static_cast<std::uint32_t>(plan.pieces.size()));
    std::uint64_t done = 0;
    do {
      std::uint64_t start = (pos + align - 1) / align * align;
      // The bucket is full when not even one unit (or, for an empty tensor, nothing) fits.
      const std::uint64_t need = bytes == 0 ? 0 : unit;
      if (start > bucket_bytes || bucket_bytes - start < need) {
        close_bucket();
        start = 0;
      }
      const std::uint64_t room = (bucket_bytes - start) / unit * unit;
      const std::uint64_t len = std::min(bytes - done, room);
      plan.pieces.push_back(Piece{static_cast<std::uint32_t>(t), bucket, done, start, len});
      if (plan.pieces.size() >= kMaxPieces) {
        return invalid_argument("the plan needs more than 2^32-2 pieces: use a larger bucket");
      }
      bucket_open = true;
      pos = start + len;
      done += len;
    } while (done < bytes);
    plan.piece_count.push_back(static_cast<std::uint32_t>(plan.pieces.size()) -
                               plan.first_piece.back());
    plan.total_bytes += bytes;
  }
  if (bucket_open) close_bucket();
  plan.bucket_begin.assign(plan.bucket_used.size() + 1, 0);
  {
    std::size_t b = 0;
    for (std::size_t i = 0; i < plan.pieces.size(); ++i) {
      while (b < plan.pieces[i].bucket) plan.bucket_begin[++b] = static_cast<std::uint32_t>(i);
    }
    while (b < plan.bucket_used.size()) {
      plan.bucket_begin[++b] = static_cast<std::uint32_t>(plan.pieces.size());
    }
  }
  return plan;
}

}  // namespace ferry::sync
