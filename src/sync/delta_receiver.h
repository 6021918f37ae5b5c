// The receiver's half of delta rounds (docs/delta.md, "Delta rounds"): which version it
// holds, its copy of every tensor in callback modes, and each blob applied and checked
// against the hash of the tensor the sender meant.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"
#include "wire/message.h"

namespace ferry::sync {

class DeltaReceiver {
 public:
  // `keep_limit`: the most bytes the copies below may hold (SyncOptions::delta_keep_limit).
  explicit DeltaReceiver(std::uint64_t keep_limit = UINT64_MAX) : keep_limit_(keep_limit) {}

  // A delta round must start from the version this receiver holds: kFailedPrecondition
  // naming both otherwise.
  Status check_begin(const wire::Begin& begin, std::uint64_t round) const;
  // The round of `begin` arrived whole: this receiver now holds its version.
  void completed(const wire::Begin& begin) { held_version_ = begin.version; }
  // A round failed: what this receiver holds is unknown.
  void forget() { held_version_ = 0; }

  // Applies `blob` onto `onto` (which holds the base version; validated before any write),
  // then checks the result against target.hash: kCorruption naming the tensor otherwise.
  Status apply(std::span<const std::byte> blob, std::span<std::byte> onto,
               const wire::DeltaTarget& target, const wire::Begin& begin,
               std::uint64_t round) const;

  // Callback modes keep a copy of every tensor, since deltas apply onto it. copy_of gives
  // the copy of `spec` (zeros when new); keep() takes a dense round's tensor into it.
  // REQUIRES: check_keep(begin) passed for the round that names `spec`.
  std::span<std::byte> copy_of(const TensorSpec& spec);
  void keep(const TensorView& tensor);

  // Callback modes, at BEGIN: the copies the round would leave (one per tensor it keeps,
  // a delta's targets or a keep_for_delta round's manifest, and those of earlier rounds it
  // does not name) must fit keep_limit. The sizes are the sender's to name, so they are
  // checked before any copy is made: kResourceExhausted naming the limit, the bytes asked
  // and SyncOptions::delta_keep_limit; kCorruption for a name the round gives twice (its
  // copy would be resized under a view already handed out).
  Status check_keep(const wire::Begin& begin, std::uint64_t round) const;
  // Bytes the copies hold now.
  std::uint64_t kept_bytes() const { return kept_bytes_; }

 private:
  std::uint64_t keep_limit_;
  std::uint64_t held_version_ = 0;  // 0: nothing a delta can apply onto
  std::unordered_map<std::string, std::vector<std::byte>> copies_;
  std::uint64_t kept_bytes_ = 0;  // the sum of copies_' sizes
};

}  // namespace ferry::sync
