// The runs encoding: for each maximal stretch of changed bytes, (gap since the previous
// run's end, length, the new bytes), gap and length as LEB128 varints. Byte granularity, so
// any dtype and odd lengths work, and a bf16 element whose low byte alone changed costs one
// payload byte; runs separated by at most kMaxMergedGap equal bytes are merged, since a new
// run's two varints would cost as much as the bytes between.
#pragma once

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t by value
#endif
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::delta {

inline constexpr std::size_t kMaxMergedGap = 2;

// What the runs scan also does for a sender that updates its snapshot (encode_and_update),
// while `current` is in cache: it copies each run into the snapshot (`previous` itself) as
// long as the body stays within `update_limit`, keeping the runs' old bytes in `undo` (a
// runs body of `undo_runs` runs) so apply_runs(undo) can restore them; and it hashes
// `current` into `hash` just behind the scan, up to `hashed` (encode_runs' caller hashes
// the rest).
struct RunsSideWork {
  std::byte* snapshot = nullptr;  // previous.data(), writable
  std::size_t update_limit = 0;
  std::vector<std::byte>* undo = nullptr;  // cleared by encode_runs; null: keep no undo
  std::uint64_t undo_runs = 0;
  bool updated_all = false;      // out: every run was copied, so previous == current
  XXH3_state_t* hash = nullptr;  // reset by the caller
  std::size_t hashed = 0;        // out: bytes of current hashed
};

// Appends the runs of `current` against `previous` to `out` and returns their number.
// Stops and returns false once the appended bytes would pass `cap`. `side` (optional)
// adds the sender's snapshot update and hash (above).
bool encode_runs(std::span<const std::byte> previous, std::span<const std::byte> current,
                 std::size_t cap, std::vector<std::byte>* out, std::uint64_t* runs,
                 RunsSideWork* side = nullptr);

// Checks that `body` holds exactly `runs` runs, each in range of a `segment_bytes`
// destination, increasing and not touching, with nothing after them.
Status check_runs(std::span<const std::byte> body, std::uint64_t runs, std::uint64_t segment_bytes,
                  std::string_view what);

// Writes the runs into `destination`. REQUIRES: check_runs() accepted `body`.
void apply_runs(std::span<const std::byte> body, std::uint64_t runs,
                std::span<std::byte> destination);

}  // namespace ferry::delta
