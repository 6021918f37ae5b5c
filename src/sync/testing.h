// Test-only hooks into the sender, standing for memory corrupted between packing and
// sending. Not on a public header; nothing but tests sets them. They are process-wide:
// set them while no round is in flight, through ScopedCorruptSlotHook so that a failed
// assertion cannot leave one set for the next test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::sync::testing {

// Called with each bucket's slot after its first segment (16 MiB) was packed and
// checksummed and before receivers hear of it; may change the slot's bytes.
using CorruptSlot = std::function<void(std::uint32_t bucket, std::byte* slot)>;
void set_corrupt_slot_hook(CorruptSlot hook);

// Sets the hook while it lives.
class ScopedCorruptSlotHook {
 public:
  explicit ScopedCorruptSlotHook(CorruptSlot hook) { set_corrupt_slot_hook(std::move(hook)); }
  ~ScopedCorruptSlotHook() { set_corrupt_slot_hook({}); }
  ScopedCorruptSlotHook(const ScopedCorruptSlotHook&) = delete;
  ScopedCorruptSlotHook& operator=(const ScopedCorruptSlotHook&) = delete;
};

// Called with each tensor's encoded delta (not dense blobs without a base) before it is
// sent; may change the bytes, standing for a delta corrupted before its checksums.
using CorruptDelta = std::function<void(const std::string& tensor, std::vector<std::byte>* blob)>;
void set_corrupt_delta_hook(CorruptDelta hook);
// Maps the base version a delta round's BEGIN names (a sender that lost track of its
// receivers), so the receivers' refusal can be tested.
using SkewDeltaBase = std::function<std::uint64_t(std::uint64_t base)>;
void set_skew_delta_base_hook(SkewDeltaBase hook);

// Sets a delta hook while it lives.
template <class Hook, void (*Set)(Hook)>
class ScopedHook {
 public:
  explicit ScopedHook(Hook hook) { Set(std::move(hook)); }
  ~ScopedHook() { Set({}); }
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;
};
using ScopedCorruptDeltaHook = ScopedHook<CorruptDelta, set_corrupt_delta_hook>;
using ScopedSkewDeltaBaseHook = ScopedHook<SkewDeltaBase, set_skew_delta_base_hook>;

}  // namespace ferry::sync::testing
