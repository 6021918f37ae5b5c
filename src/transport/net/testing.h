// Test-only hooks into the net transport, standing for an attacker on the path. Not on a
// public header; nothing but tests sets them. Set them before the channels they should
// affect are used, and clear them (empty function) after: they are process-wide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ferry/status.h"

namespace ferry::net {
class Channel;
}

namespace ferry::net::testing {

using Tamper = std::function<void(std::span<std::byte>)>;

// Sees each sealed control frame (after its length) this process receives, before it is
// opened, and may change it.
void set_control_tamper(Tamper hook);
// Sees each bulk message's bytes as they arrived, before they are checked, and may change them.
void set_bulk_tamper(Tamper hook);
// Sends a sealed frame of `kind` (endpoint.h's FrameKind, raw) and `payload` on `channel`: a
// token holder that breaks the protocol.
Status send_frame(Channel& channel, std::uint8_t kind, std::span<const std::byte> payload);

}  // namespace ferry::net::testing
