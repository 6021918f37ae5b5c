#include "ferry/sender_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string_view>
#include <unordered_set>

namespace ferry::sync {

Result<std::vector<std::vector<std::size_t>>> split_into_parts(std::span<const TensorSpec> tensors,
                                                               std::uint32_t parts) {
  if (parts == 0) return invalid_argument("split_into_parts: give 1 or more parts");
  std::unordered_set<std::string_view> names;
  for (const TensorSpec& t : tensors) {
    if (!names.insert(t.name).second) {
      return invalid_argument(fmt::format(
          "split_into_parts: tensor '{}' is given twice; names must be unique", t.name));
    }
  }
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const std::uint64_t x = tensors[a].bytes();
    const std::uint64_t y = tensors[b].bytes();
    return x != y ? x > y : tensors[a].name < tensors[b].name;
  });
  std::vector<std::uint64_t> part_bytes(parts, 0);
  std::vector<std::uint32_t> part_of(tensors.size(), 0);
  for (std::size_t i : order) {
    // min_element returns the first of equal minima: ties go to the lowest part.
    const auto lightest = std::min_element(part_bytes.begin(), part_bytes.end());
    *lightest += tensors[i].bytes();
    part_of[i] = static_cast<std::uint32_t>(lightest - part_bytes.begin());
  }
  std::vector<std::vector<std::size_t>> out(parts);
  for (std::size_t i = 0; i < tensors.size(); ++i) out[part_of[i]].push_back(i);
  return out;
}

}  // namespace ferry::sync
