// The bucket copy routines: exact bytes, and a hash taken while copying that equals the
// hash of the whole slot, padding included, at sizes around the streaming and chunk sizes.
#include "sync/copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace ferry::sync {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> v(n);
  for (std::byte& b : v) b = static_cast<std::byte>(gen());
  return v;
}

struct PieceAt {
  std::size_t offset;
  std::size_t length;
};

// Pieces of these lengths, each at the next 16-byte boundary plus `gap` bytes.
std::vector<PieceAt> layout(const std::vector<std::size_t>& lengths, std::size_t gap) {
  std::vector<PieceAt> pieces;
  std::size_t at = 0;
  for (std::size_t n : lengths) {
    at = (at + 15) / 16 * 16 + gap;
    pieces.push_back({at, n});
    at += n;
  }
  return pieces;
}

TEST(BucketHash, PackingHashEqualsTheSlotHashAndCopiesExactly) {
  const std::vector<std::size_t> lengths = {0,
                                            1,
                                            15,
                                            1000,
                                            kStreamingCopyBytes - 1,
                                            kStreamingCopyBytes,
                                            kStreamingCopyBytes + 77,
                                            (3u << 20) + 5,
                                            128u << 10,
                                            (128u << 10) + 1};
  for (std::size_t gap : {0u, 16u, 48u}) {
    const auto pieces = layout(lengths, gap);
    const std::size_t used = pieces.back().offset + pieces.back().length + 9;
    const std::vector<std::byte> source = random_bytes(used, 7);
    std::vector<std::byte> slot = random_bytes(used, 11);  // stale bytes stay in the padding
    BucketHash hash(slot.data());
    for (const PieceAt& p : pieces) {
      hash.copy_piece(slot.data() + p.offset, source.data() + p.offset, p.length, p.offset);
    }
    const std::uint64_t sum = hash.finish(used);
    EXPECT_EQ(sum, XXH3_64bits(slot.data(), used)) << "gap " << gap;
    for (const PieceAt& p : pieces) {
      ASSERT_TRUE(std::equal(source.begin() + static_cast<std::ptrdiff_t>(p.offset),
                             source.begin() + static_cast<std::ptrdiff_t>(p.offset + p.length),
                             slot.begin() + static_cast<std::ptrdiff_t>(p.offset)))
          << "piece at " << p.offset << " of " << p.length << " bytes, gap " << gap;
    }
  }
}

TEST(BucketHash, UnpackingHashCatchesOneFlippedBit) {
  const auto pieces = layout({(2u << 20) + 3, 100, kStreamingCopyBytes}, 0);
  const std::size_t used = pieces.back().offset + pieces.back().length;
  std::vector<std::byte> slot = random_bytes(used, 3);
  const std::uint64_t announced = XXH3_64bits(slot.data(), used);
  for (std::size_t flip : {std::size_t{0}, std::size_t{(1u << 20) + 12345}, used - 1}) {
    std::vector<std::byte> corrupt = slot;
    corrupt[flip] ^= std::byte{0x10};
    std::vector<std::byte> out(used);
    BucketHash hash(corrupt.data());
    for (const PieceAt& p : pieces) {
      hash.copy_piece(out.data() + p.offset, corrupt.data() + p.offset, p.length, p.offset);
    }
    EXPECT_NE(hash.finish(used), announced) << "flipped byte " << flip;
  }
  BucketHash clean(slot.data());
  std::vector<std::byte> out(used);
  for (const PieceAt& p : pieces) {
    clean.copy_piece(out.data() + p.offset, slot.data() + p.offset, p.length, p.offset);
  }
  EXPECT_EQ(clean.finish(used), announced);
}

}  // namespace
}  // namespace ferry::sync
