// Test-only hooks into the net transport, standing for an attacker on the path. Not on a
// public header; nothing but tests sets them. Set them before the channels they should
// affect are used, and clear them (empty function) after: they are process-wide.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace ferry::net::testing {

using Tamper = std::function<void(std::span<std::byte>)>;

// Sees each sealed control frame (after its length) this process receives, before it is
// opened, and may change it.
void set_control_tamper(Tamper hook);
// Sees each bulk message's bytes as they arrived, before they are checked, and may change them.
void set_bulk_tamper(Tamper hook);

}  // namespace ferry::net::testing
