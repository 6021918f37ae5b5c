// Splitting one model among several senders: each trainer rank serves one part over its own
// session and a MultiReceiver (ferry/multi_receiver.h) assembles the union.
//
//   auto parts = ferry::sync::split_into_parts(specs, world_size);  // the same on every rank
//   for (std::size_t i : (*parts)[rank]) views.push_back({specs[i], data[i]});
//   sender->send_round(views);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::sync {

// Splits `tensors` into `parts` disjoint parts of about equal bytes: the largest tensor first
// (ties by name), each to the part holding the fewest bytes so far (ties: the lowest part).
// The split depends on the names and sizes only, not on the order given, so every rank
// computes the same one. Returns each part's tensor indices, in the order given; a part may
// be empty when there are fewer tensors than parts. kInvalidArgument for 0 parts or a name
// given twice.
FERRY_EXPORT Result<std::vector<std::vector<std::size_t>>> split_into_parts(
    std::span<const TensorSpec> tensors, std::uint32_t parts);

}  // namespace ferry::sync
