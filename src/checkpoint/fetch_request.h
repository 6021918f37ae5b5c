// The requests one rank sends another during a collective load (docs/checkpoint.md,
// "How a load runs"): JSON text, decoded here and only here, so a malformed request
// from a peer is a corruption error naming the field, never an exception. Not
// invalid_argument: the bytes came from another rank, not from the user.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/slice.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

struct FetchRequest {
  enum class Op : std::uint8_t { kManifest, kSlice };
  Op op = Op::kSlice;
  std::int64_t step = 0;
  // kSlice only: slice `slice` of `tensor`, the part `region` of it (global coordinates).
  std::string tensor;
  std::size_t slice = 0;
  Box region;
  // kSlice only: slices (tensor, index) the sender will ask for next, to read ahead.
  std::vector<std::pair<std::string, std::size_t>> ahead;

  friend bool operator==(const FetchRequest&, const FetchRequest&) = default;
};

// The most `ahead` entries a request may carry; the loader's AheadWindow (readahead.h)
// never names more, whatever the slices' sizes.
inline constexpr std::size_t kMaxAheadHints = 64;

std::string encode_fetch_request(const FetchRequest& r);
// `from` names the sender in errors ("rank 3").
Result<FetchRequest> decode_fetch_request(std::string_view text, std::string_view from);

}  // namespace ferry::checkpoint
