// Host memory for the demo and the benchmark: anonymous mappings and tensors laid
// out back to back in them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::tools {

// Anonymous private memory. `dont_fork` (MADV_DONTFORK) keeps forked receivers from
// inheriting it, so their RSS shows only their own memory; `prefault` backs every page now
// (base/prefault.h), so a timed copy into it does not pay first-touch costs.
Result<MappedRegion> map_anonymous(std::uint64_t bytes, bool dont_fork, bool prefault);

// Views of `specs` laid out back to back from `base`. REQUIRES: base holds their bytes.
std::vector<TensorView> lay_out(const std::vector<TensorSpec>& specs, const std::byte* base);

}  // namespace ferry::tools
