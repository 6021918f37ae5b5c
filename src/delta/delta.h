// The delta codec: what changed between two versions of one segment (a tensor or a bucket),
// as bytes a peer can send, and their application in place onto the previous version.
//
// A sender holds the previous bytes of a segment and the new ones and calls encode(); a
// receiver holds the previous bytes in its destination and calls apply(). Both sides must
// hold the same previous bytes: the codec does not check that (the round names its base
// version and checks a hash of every resulting tensor). The format is in docs/delta.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "delta/format.h"
#include "ferry/status.h"

namespace ferry::delta {

enum class Choice : std::uint8_t {
  kAuto,     // the smallest by an estimate (one scan, a sampled zstd); never above dense
  kDense,    // the current bytes
  kRuns,     // (gap, length, bytes) runs of changed bytes
  kXorZstd,  // previous XOR current, compressed with zstd
};

struct EncodeOptions {
  Choice choice = Choice::kAuto;
  // zstd level for kXorZstd. 1 (the default) compresses sparse XORs as well as level 3 at
  // a fraction of the time; negative levels are faster still and larger (docs/delta.md).
  int zstd_level = 1;
  // kAuto takes kXorZstd only when its estimate is at most this fraction of the best other
  // encoding: it encodes and applies several times slower than runs and dense
  // (docs/benchmarks.md), so it must save bytes to pay. Raise it toward 1 where bytes cost
  // more than CPU (a slow network), lower it to 0 to never pick it.
  double xor_zstd_advantage = 0.5;
};

// Encodes `current` against `previous` (same length; kInvalidArgument otherwise). A forced
// kRuns or kXorZstd that would be larger than dense is still produced as asked; kAuto
// never returns more than kHeaderBytes + current.size() bytes.
Result<std::vector<std::byte>> encode(std::span<const std::byte> previous,
                                      std::span<const std::byte> current,
                                      const EncodeOptions& options = {});
// The same into `out`, replacing its contents but keeping its capacity: a caller that
// encodes round after round reuses one buffer and skips faulting in fresh pages.
Status encode_into(std::span<const std::byte> previous, std::span<const std::byte> current,
                   const EncodeOptions& options, std::vector<std::byte>* out);

// encode_into, and the XXH3-64 (seed 0) of `current` in `*current_hash`: what a receiver
// compares with XXH3_64bits of its destination after apply().
Status encode_into_hashed(std::span<const std::byte> previous, std::span<const std::byte> current,
                          const EncodeOptions& options, std::vector<std::byte>* out,
                          std::uint64_t* current_hash);

// Applies `encoded` (untrusted: from a peer) onto `destination`, which holds the previous
// bytes. Everything is validated first (header, checksum, every run, the zstd frame), so
// on any error `destination` is unchanged; errors are kCorruption and name `what` (the
// segment or tensor) and the field at fault.
Status apply(std::span<const std::byte> encoded, std::span<std::byte> destination,
             std::string_view what);

// The number of 8-byte words that differ (a trailing partial word counts as one): what
// kAuto counts over its sample first to tell sparse updates from dense ones.
std::uint64_t count_differing_words(std::span<const std::byte> previous,
                                    std::span<const std::byte> current);

}  // namespace ferry::delta
