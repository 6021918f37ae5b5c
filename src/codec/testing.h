// Test-only hooks: into the delta codec, standing for a delta corrupted before its checksums
// and a sender that lost track of its receivers; and into the registry, so a test can run a
// codec of its own through real rounds. Not on a public header; nothing but tests sets them. They
// are process-wide: set them while no round is in flight, through the Scoped* classes so that a
// failed assertion cannot leave one set for the next test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codec/tensor_codec.h"

namespace ferry::codec::testing {

// Called with each tensor's encoded delta (not dense payloads without a base) before it is
// sent; may change the bytes.
using CorruptDelta = std::function<void(const std::string& tensor, std::vector<std::byte>* blob)>;
void set_corrupt_delta_hook(CorruptDelta hook);
// Maps the base version a delta round's BEGIN names, so the receivers' refusal can be tested.
using SkewDeltaBase = std::function<std::uint64_t(std::uint64_t base)>;
void set_skew_delta_base_hook(SkewDeltaBase hook);

// Every Sender created while it is set gets the factory's codec, whatever its options say.
using SendCodecFactory = std::function<std::unique_ptr<SendCodec>()>;
void set_send_codec_factory(SendCodecFactory factory);
// Receivers decode codec `id` with `codec` (nullptr: the registry's own answer again).
struct ExtraReceiveCodec {
  std::uint8_t id = 0;
  const ReceiveCodec* codec = nullptr;
};
void set_extra_receive_codec(ExtraReceiveCodec extra);

// Sets a hook while it lives.
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
using ScopedSendCodecFactory = ScopedHook<SendCodecFactory, set_send_codec_factory>;
using ScopedExtraReceiveCodec = ScopedHook<ExtraReceiveCodec, set_extra_receive_codec>;

}  // namespace ferry::codec::testing
