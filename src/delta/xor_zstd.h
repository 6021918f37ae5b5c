// The xor_zstd encoding: previous XOR current as one zstd frame that states its content
// size. Equal bytes XOR to zero, which zstd compresses to almost nothing; changed bf16
// elements leave small values that it entropy-codes. Both directions stream through a small
// scratch buffer, so neither side holds a second copy of the segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::delta {

// Appends the frame to `out`; false (and `out` resized back) once it would pass `cap` bytes.
bool encode_xor_zstd(std::span<const std::byte> previous, std::span<const std::byte> current,
                     int level, std::size_t cap, std::vector<std::byte>* out);

// The most a frame of `content_bytes` can take (zstd's bound).
std::size_t xor_zstd_bound(std::size_t content_bytes);

// The compressed size of previous XOR current over the given byte ranges (offset, length),
// as one frame: auto's estimate from a sample of the segment.
std::size_t xor_zstd_sample_size(std::span<const std::byte> previous,
                                 std::span<const std::byte> current,
                                 std::span<const std::pair<std::size_t, std::size_t>> ranges,
                                 int level);

// Checks that `body` is exactly one zstd frame that decodes without error to exactly
// `segment_bytes` bytes (it is decoded into scratch and discarded).
Status check_xor_zstd(std::span<const std::byte> body, std::uint64_t segment_bytes,
                      std::string_view what);

// XORs the decoded frame into `destination`. REQUIRES: check_xor_zstd() accepted `body`.
void apply_xor_zstd(std::span<const std::byte> body, std::span<std::byte> destination);

}  // namespace ferry::delta
