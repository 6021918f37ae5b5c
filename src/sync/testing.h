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

}  // namespace ferry::sync::testing
