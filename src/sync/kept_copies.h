// A receiver's own copy of each tensor, for rounds it hands out as views: an encoded round's
// payloads decode onto them (delta: onto the previous version), and a round whose BEGIN says
// keep_copies leaves its tensors in them for the rounds after it. Receivers that write into
// their caller's destinations keep none: the destinations hold the tensors.
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

class KeptCopies {
 public:
  // `limit`: the most bytes the copies may hold (SyncOptions::delta_keep_limit).
  explicit KeptCopies(std::uint64_t limit = UINT64_MAX) : limit_(limit) {}

  // At BEGIN of a round that decodes or keeps (an encoded round, or keep_copies): the copies it
  // would leave (one per tensor it delivers, and those of earlier rounds it does not name) must fit
  // the limit. The sizes are the sender's to name, so they are checked before any copy is made:
  // kResourceExhausted naming the limit, the bytes asked and SyncOptions::delta_keep_limit;
  // kCorruption for a name the round gives twice (its copy would be resized under a view
  // already handed out).
  Status check(const wire::Begin& begin, std::uint64_t round) const;
  // The copy of `spec` (zeros when new). REQUIRES: check() passed for the round naming it.
  std::span<std::byte> copy_of(const TensorSpec& spec);
  // Takes a tensor's bytes into its copy.
  void keep(const TensorView& tensor);
  // Bytes the copies hold now.
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::uint64_t limit_;
  std::unordered_map<std::string, std::vector<std::byte>> copies_;
  std::uint64_t bytes_ = 0;  // the sum of copies_' sizes
};

}  // namespace ferry::sync
