// The delta format's header (docs/delta.md has the byte table). All fields little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ferry/status.h"

namespace ferry::delta {

inline constexpr std::uint32_t kMagic = 0x544C4446;  // "FDLT" as bytes on the wire
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 40;
// The checksum covers header bytes [0, kChecksumOffset) and the whole body.
inline constexpr std::size_t kChecksumOffset = 32;

enum class Encoding : std::uint8_t { kDense = 0, kRuns = 1, kXorZstd = 2 };
std::string_view encoding_name(Encoding encoding);

struct Header {
  Encoding encoding = Encoding::kDense;
  std::uint64_t segment_bytes = 0;  // length of the previous, current and destination bytes
  std::uint64_t body_bytes = 0;     // bytes after the header
  std::uint64_t count = 0;          // kRuns: the number of runs; 0 otherwise
};

// Writes the header into out[0, kHeaderBytes), with the checksum of that header and `body`.
void write_header(const Header& header, std::span<const std::byte> body, std::byte* out);

// Parses and checks the header of `encoded` (magic, version, encoding, reserved bytes,
// body length against what is there, checksum) for a destination of `segment_bytes`.
// kCorruption names `what` and the field at fault.
Result<Header> read_header(std::span<const std::byte> encoded, std::uint64_t segment_bytes,
                           std::string_view what);

}  // namespace ferry::delta
