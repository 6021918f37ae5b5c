#include "delta/training_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace ferry::delta {
namespace {

// splitmix64: fast, and good enough for synthetic data (not for anything secret).
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

void store_u16(std::byte* p, std::uint16_t v) {
  p[0] = static_cast<std::byte>(v);
  p[1] = static_cast<std::byte>(v >> 8);
}

void change_one(SplitMix* rng, std::byte* element, std::size_t bytes) {
  if (rng->next() & 1) {
    element[0] = static_cast<std::byte>(static_cast<std::uint8_t>(element[0]) + 1);
    return;
  }
  const std::byte old = element[0];
  for (std::size_t i = 0; i < bytes; ++i) element[i] = static_cast<std::byte>(rng->next());
  if (element[0] == old) element[0] = ~old;  // random bytes may repeat the old value
}

}  // namespace

void change_elements(std::uint64_t seed, double density, std::size_t element_bytes,
                     std::span<std::byte> data) {
  SplitMix rng{seed};
  const std::size_t elements = (data.size() + element_bytes - 1) / element_bytes;
  const auto bytes_of = [&](std::size_t e) {
    return std::min(element_bytes, data.size() - e * element_bytes);
  };
  if (density >= 1.0) {
    for (std::size_t e = 0; e < elements; ++e) {
      change_one(&rng, data.data() + e * element_bytes, bytes_of(e));
    }
    return;
  }
  // Positions with replacement: a repeat changes an element twice, which only matters when
  // the two changes cancel (+1 twice never does; random bytes rarely).
  const auto changes =
      static_cast<std::size_t>(std::llround(density * static_cast<double>(elements)));
  for (std::size_t i = 0; i < changes; ++i) {
    const std::size_t e = rng.next() % elements;
    change_one(&rng, data.data() + e * element_bytes, bytes_of(e));
  }
}

double adam_step_bf16(std::uint64_t seed, double lr, std::span<std::byte> before,
                      std::span<std::byte> after) {
  SplitMix rng{seed};
  const std::size_t elements = std::min(before.size(), after.size()) / 2;
  std::size_t changed = 0;
  for (std::size_t i = 0; i < elements; ++i) {
    // Box-Muller: two normals from two uniforms.
    const double radius = std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));
    const double angle = 2.0 * std::numbers::pi * rng.uniform();
    const auto weight = static_cast<float>(0.02 * radius * std::cos(angle));
    const double gradient = radius * std::sin(angle);
    const auto updated = static_cast<float>(weight - lr * gradient / (std::fabs(gradient) + 1e-8));
    const std::uint16_t b = to_bf16(weight), a = to_bf16(updated);
    store_u16(before.data() + 2 * i, b);
    store_u16(after.data() + 2 * i, a);
    changed += a != b;
  }
  return elements == 0 ? 0.0 : static_cast<double>(changed) / static_cast<double>(elements);
}

}  // namespace ferry::delta
