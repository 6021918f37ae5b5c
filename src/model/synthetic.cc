// Deterministic synthetic tensor bytes: byte o of tensor `name` depends only on
// (seed, name, o), so pieces of any size fill identically and a receiver can
// verify what it got without the sender's copy.
#include <xxhash.h>

#include <cstring>

#include "ferry/model.h"

namespace ferry::model {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void fill_synthetic(std::uint64_t seed, std::string_view name, std::uint64_t offset,
                    std::span<std::byte> out) {
  const std::uint64_t key = XXH3_64bits_withSeed(name.data(), name.size(), seed);
  std::size_t i = 0;
  std::uint64_t word = offset / 8;
  // Unaligned head: the tail bytes of the first word.
  if (const std::size_t skip = offset % 8; skip != 0) {
    const std::uint64_t v = splitmix64(key + word++);
    for (std::size_t b = skip; b < 8 && i < out.size(); ++b, ++i) {
      out[i] = static_cast<std::byte>(v >> (8 * b));
    }
  }
  for (; i + 8 <= out.size(); i += 8) {
    const std::uint64_t v = splitmix64(key + word++);  // little-endian host assumed (x86, arm64)
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const std::uint64_t v = splitmix64(key + word);
    for (std::size_t b = 0; i < out.size(); ++b, ++i) out[i] = static_cast<std::byte>(v >> (8 * b));
  }
}

}  // namespace ferry::model
