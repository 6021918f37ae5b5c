#include "sync/delta_receiver.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <string_view>
#include <unordered_set>

#include "base/status_macros.h"
#include "delta/delta.h"
#include "sync/copy.h"

namespace ferry::sync {
namespace {

// a + b, or UINT64_MAX when that overflows: sizes come from the sender.
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

Status DeltaReceiver::check_begin(const wire::Begin& begin, std::uint64_t round) const {
  if (begin.delta == 0 || begin.base_version == held_version_) return ok_status();
  return failed_precondition(fmt::format(
      "round {} is a delta from version {} to {}, but this receiver holds {}", round,
      begin.base_version, begin.version,
      held_version_ == 0 ? std::string("no version") : fmt::format("version {}", held_version_)));
}

Status DeltaReceiver::apply(std::span<const std::byte> blob, std::span<std::byte> onto,
                            const wire::DeltaTarget& target, const wire::Begin& begin,
                            std::uint64_t round) const {
  const std::string what = fmt::format("round {} tensor '{}'", round, target.spec.name);
  FERRY_RETURN_IF_ERROR(delta::apply(blob, onto, what));
  const std::uint64_t hash = XXH3_64bits(onto.data(), onto.size());
  if (hash == target.hash) return ok_status();
  return corruption(fmt::format(
      "{}: after the delta from version {} to {} its bytes hash to {:016x}, the sender's to "
      "{:016x}: what this receiver held was not version {} (a destination changed between rounds?)",
      what, begin.base_version, begin.version, hash, target.hash, begin.base_version));
}

Status DeltaReceiver::check_keep(const wire::Begin& begin, std::uint64_t round) const {
  if (begin.delta == 0 && begin.keep_for_delta == 0) return ok_status();
  const std::size_t count = begin.delta != 0 ? begin.targets.size() : begin.manifest.size();
  // After the round the copies hold every tensor it keeps, at its new size, and the copies
  // of names it does not give, as they are.
  std::uint64_t others = kept_bytes_;
  std::uint64_t asked = 0;
  std::unordered_set<std::string_view> names;
  for (std::size_t i = 0; i < count; ++i) {
    const TensorSpec& spec = begin.delta != 0 ? begin.targets[i].spec : begin.manifest[i];
    if (!names.insert(spec.name).second) {
      return corruption(fmt::format("round {}: BEGIN names tensor '{}' twice", round, spec.name));
    }
    const auto held = copies_.find(spec.name);
    if (held != copies_.end()) others -= held->second.size();
    asked = saturating_add(asked, spec.bytes());
  }
  if (saturating_add(others, asked) <= keep_limit_) return ok_status();
  return resource_exhausted(fmt::format(
      "round {}: keeping copies of its {} tensors for delta rounds asks {} bytes; with the {} "
      "bytes kept for other tensors that passes this receiver's limit of {} bytes "
      "(SyncOptions::delta_keep_limit): raise it, receive into destinations (they keep no "
      "copy), or turn delta rounds off on the sender",
      round, count, asked, others, keep_limit_));
}

std::span<std::byte> DeltaReceiver::copy_of(const TensorSpec& spec) {
  std::vector<std::byte>& copy = copies_[spec.name];
  if (copy.size() != spec.bytes()) {
    kept_bytes_ -= copy.size();
    copy.assign(spec.bytes(), std::byte{0});
    kept_bytes_ += copy.size();
  }
  return copy;
}

void DeltaReceiver::keep(const TensorView& tensor) {
  const std::span<std::byte> copy = copy_of(tensor.spec);
  copy_bytes(copy.data(), tensor.data.data(), tensor.data.size());
}

}  // namespace ferry::sync
