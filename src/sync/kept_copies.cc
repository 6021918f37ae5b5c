#include "sync/kept_copies.h"

#include <fmt/format.h>

#include <string_view>
#include <unordered_set>

#include "sync/copy.h"

namespace ferry::sync {
namespace {

// a + b, or UINT64_MAX when that overflows: sizes come from the sender.
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

Status KeptCopies::check(const wire::Begin& begin, std::uint64_t round) const {
  const bool encoded = begin.codec != wire::kDense;
  const std::size_t count = encoded ? begin.targets.size() : begin.manifest.size();
  // After the round the copies hold every tensor it keeps, at its new size, and the copies
  // of names it does not give, as they are.
  std::uint64_t others = bytes_;
  std::uint64_t asked = 0;
  std::unordered_set<std::string_view> names;
  for (std::size_t i = 0; i < count; ++i) {
    const TensorSpec& spec = encoded ? begin.targets[i].spec : begin.manifest[i];
    if (!names.insert(spec.name).second) {
      return corruption(fmt::format("round {}: BEGIN names tensor '{}' twice", round, spec.name));
    }
    const auto held = copies_.find(spec.name);
    if (held != copies_.end()) others -= held->second.size();
    asked = saturating_add(asked, spec.bytes());
  }
  if (saturating_add(others, asked) <= limit_) return ok_status();
  return resource_exhausted(fmt::format(
      "round {}: keeping copies of its {} tensors for delta rounds asks {} bytes; with the {} "
      "bytes kept for other tensors that passes this receiver's limit of {} bytes "
      "(SyncOptions::delta_keep_limit): raise it, receive into destinations (they keep no "
      "copy), or turn delta rounds off on the sender",
      round, count, asked, others, limit_));
}

std::span<std::byte> KeptCopies::copy_of(const TensorSpec& spec) {
  std::vector<std::byte>& copy = copies_[spec.name];
  if (copy.size() != spec.bytes()) {
    bytes_ -= copy.size();
    copy.assign(spec.bytes(), std::byte{0});
    bytes_ += copy.size();
  }
  return copy;
}

void KeptCopies::keep(const TensorView& tensor) {
  const std::span<std::byte> copy = copy_of(tensor.spec);
  copy_bytes(copy.data(), tensor.data.data(), tensor.data.size());
}

}  // namespace ferry::sync
