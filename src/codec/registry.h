// The codecs a round may name, by their id in BEGIN. Adding a codec: its file in this folder,
// a line in each function of registry.cc, and its test.
#pragma once

#include <cstdint>
#include <memory>

#include "codec/tensor_codec.h"
#include "ferry/sync.h"

namespace ferry::codec {

// Ids travel on the wire: never renumber. 0 is wire::kDense (no codec).
inline constexpr std::uint8_t kDeltaId = 1;

// The sender's codec for `options`; nullptr when its rounds go dense.
std::unique_ptr<SendCodec> make_send_codec(const sync::SyncOptions& options);
// The codec of `id`; nullptr for wire::kDense and for an id this build does not know.
const ReceiveCodec* receive_codec(std::uint8_t id);

}  // namespace ferry::codec
