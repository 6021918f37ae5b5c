// Where Receiver::receive_round_into writes a round's tensors: the caller's registered
// destinations (whole tensors, or rank-local slices registered by the whole tensor's name),
// resolved against the round's manifest once per change of either, so a round of 20,000
// small tensors does not look up 20,000 names.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::sync {

class Destinations {
 public:
  // `destination` takes the tensor of its spec's name, replacing what that name had.
  Status set(MutableTensorView destination);
  // `local` takes the bytes `slice` selects of the tensor slice.whole names.
  Status set(const TensorSlice& slice, std::span<std::byte> local);
  void clear();

  // Finds each of the round's tensors' destination, unless `generation` (the reader's
  // tensors_generation) and the registrations are unchanged since the last success. Fails
  // naming every tensor without a destination or with one of another dtype or shape.
  Status resolve(const RoundBegin& begin, std::uint64_t generation);
  // After resolve(): where round tensor i goes, and its slice (empty when none is a slice).
  std::span<std::byte* const> data() const { return data_; }
  std::span<const TensorSlice* const> slices() const { return slice_of_; }

 private:
  std::unordered_map<std::string, MutableTensorView> destinations_;
  std::unordered_map<std::string, TensorSlice> slices_;  // their data is in destinations_
  std::vector<std::byte*> data_;
  std::vector<const TensorSlice*> slice_of_;
  std::optional<std::uint64_t> resolved_generation_;
};

}  // namespace ferry::sync
