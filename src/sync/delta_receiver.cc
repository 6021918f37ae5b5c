#include "sync/delta_receiver.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "base/status_macros.h"
#include "delta/delta.h"
#include "sync/copy.h"

namespace ferry::sync {

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

std::span<std::byte> DeltaReceiver::copy_of(const TensorSpec& spec) {
  std::vector<std::byte>& copy = copies_[spec.name];
  if (copy.size() != spec.bytes()) copy.assign(spec.bytes(), std::byte{0});
  return copy;
}

void DeltaReceiver::keep(const TensorView& tensor) {
  const std::span<std::byte> copy = copy_of(tensor.spec);
  copy_bytes(copy.data(), tensor.data.data(), tensor.data.size());
}

}  // namespace ferry::sync
