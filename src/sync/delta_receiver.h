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
  std::span<std::byte> copy_of(const TensorSpec& spec);
  void keep(const TensorView& tensor);

 private:
  std::uint64_t held_version_ = 0;  // 0: nothing a delta can apply onto
  std::unordered_map<std::string, std::vector<std::byte>> copies_;
};

}  // namespace ferry::sync
