// Cuts an ordered list of tensors into pieces that fill fixed-size buckets.
//
// The plan depends only on the manifest and the bucket size, so the sender and
// every receiver compute the same plan and only the manifest travels. A tensor
// larger than a bucket spans as many buckets as it needs: no size fails.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::sync {

// Pieces start at bucket offsets aligned to this (and to the element size):
// enough for SSE/AVX copies and for any dtype's natural alignment.
inline constexpr std::uint64_t kPieceAlignment = 16;

struct Piece {
  std::uint32_t tensor = 0;  // index in the manifest
  std::uint32_t bucket = 0;
  std::uint64_t tensor_offset = 0;  // bytes into the tensor
  std::uint64_t bucket_offset = 0;  // bytes into the bucket
  std::uint64_t length = 0;         // 0 only for an empty tensor

  friend bool operator==(const Piece&, const Piece&) = default;
};

struct BucketPlan {
  std::uint64_t bucket_bytes = 0;
  std::uint64_t total_bytes = 0;  // tensor bytes (padding excluded)
  std::vector<Piece> pieces;      // in bucket order, then offset order
  // Bucket b holds pieces [bucket_begin[b], bucket_begin[b + 1]).
  std::vector<std::uint32_t> bucket_begin;
  std::vector<std::uint64_t> bucket_used;  // bytes up to the end of the last piece
  // pieces_of_tensor[t] is the index of tensor t's first piece; its pieces are consecutive.
  std::vector<std::uint32_t> first_piece;
  std::vector<std::uint32_t> piece_count;

  std::uint32_t bucket_count() const { return static_cast<std::uint32_t>(bucket_used.size()); }
  std::span<const Piece> bucket(std::uint32_t b) const {
    return std::span(pieces).subspan(bucket_begin[b], bucket_begin[b + 1] - bucket_begin[b]);
  }
};

// Smallest unit a piece boundary may fall on: the element size, or for sub-byte
// dtypes the bytes that hold a whole number of elements (F4: 1, F6: 3).
std::uint64_t split_unit(DType dtype);

// REQUIRES nothing: a bucket_bytes below kPieceAlignment or not a multiple of it
// is an invalid_argument error, as is a manifest of more than 2^32 - 1 pieces.
Result<BucketPlan> plan_buckets(std::span<const TensorSpec> manifest, std::uint64_t bucket_bytes);

}  // namespace ferry::sync
