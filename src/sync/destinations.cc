#include "sync/destinations.h"

#include <fmt/format.h>

#include <utility>

#include "base/status_macros.h"

namespace ferry::sync {

Status Destinations::set(MutableTensorView destination) {
  if (destination.data.size() != destination.spec.bytes()) {
    return invalid_argument(fmt::format("destination '{}': {} bytes given, {} needs {}",
                                        destination.spec.name, destination.data.size(),
                                        destination.spec.to_string(), destination.spec.bytes()));
  }
  std::string name = destination.spec.name;
  slices_.erase(name);
  destinations_.insert_or_assign(std::move(name), std::move(destination));
  resolved_generation_.reset();
  return ok_status();
}

Status Destinations::set(const TensorSlice& slice, std::span<std::byte> local) {
  FERRY_RETURN_IF_ERROR(slice.check());
  if (local.size() != slice.local.bytes()) {
    return invalid_argument(fmt::format(
        "destination for the slice '{}' of {}: {} bytes given, {} needs {}", slice.local.name,
        slice.whole.to_string(), local.size(), slice.local.to_string(), slice.local.bytes()));
  }
  const std::string& name = slice.whole.name;
  destinations_.insert_or_assign(name, MutableTensorView{slice.local, local});
  slices_.insert_or_assign(name, slice);
  resolved_generation_.reset();
  return ok_status();
}

void Destinations::clear() {
  destinations_.clear();
  slices_.clear();
  resolved_generation_.reset();
}

Status Destinations::resolve(const RoundBegin& begin, std::uint64_t generation) {
  if (resolved_generation_ == generation) return ok_status();
  std::vector<std::string> problems;
  data_.assign(begin.tensors.size(), nullptr);
  slice_of_.assign(slices_.empty() ? 0 : begin.tensors.size(), nullptr);
  for (std::size_t i = 0; i < begin.tensors.size(); ++i) {
    const TensorSpec& spec = begin.tensors[i];
    auto it = destinations_.find(spec.name);
    if (it == destinations_.end()) {
      problems.push_back(
          fmt::format("missing destination for '{}' ({})", spec.name, spec.to_string()));
      continue;
    }
    data_[i] = it->second.data.data();
    const TensorSpec* whole = &it->second.spec;
    if (auto slice = slices_.find(spec.name); slice != slices_.end()) {
      slice_of_[i] = &slice->second;
      whole = &slice->second.whole;
    }
    const TensorSpec& d = *whole;
    if (d.dtype != spec.dtype || d.shape != spec.shape) {
      problems.push_back(fmt::format("'{}': sender sends {} {}, destination is {} {}", spec.name,
                                     spec.shape_string(), dtype_name(spec.dtype), d.shape_string(),
                                     dtype_name(d.dtype)));
    }
  }
  if (problems.empty()) {
    resolved_generation_ = generation;
    return ok_status();
  }
  std::string text = fmt::format(
      "round {}: {} manifest mismatch(es) in destination mode:", begin.round, problems.size());
  for (const std::string& p : problems) text += "\n  " + p;
  return invalid_argument(text);
}

}  // namespace ferry::sync
