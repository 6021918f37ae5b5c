// Synthetic weight updates with the statistics of RL training, for tests, benchmarks and
// demos of the delta codec: random element changes at a chosen density, and one Adam step.
// Deterministic: the same seed gives the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::delta {

// Changes round(density * elements) randomly chosen `element_bytes`-wide elements of `data`
// (a trailing partial element counts as one) to a different value: half of them by one in
// the lowest byte (a bf16 ulp), half to random bytes. density 1.0 changes every element.
void change_elements(std::uint64_t seed, double density, std::size_t element_bytes,
                     std::span<std::byte> data);

// One Adam step as mixed-precision training takes it: fp32 master weights ~ N(0, 0.02),
// gradients ~ N(0, 1); the first step's update is lr * g / (|g| + 1e-8) (bias-corrected
// moments m = g, v = g^2). `before` and `after` get the bf16 weights published before and
// after (round to nearest even); spans of equal, even length. Returns the fraction of the
// bf16 elements that changed.
double adam_step_bf16(std::uint64_t seed, double lr, std::span<std::byte> before,
                      std::span<std::byte> after);

}  // namespace ferry::delta
